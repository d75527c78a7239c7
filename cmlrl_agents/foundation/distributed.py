"""Data parallel training across processes (``torchrun`` / ``accelerate launch``).

Launched with ``WORLD_SIZE > 1`` in the environment, :func:`data_parallel` initialises
``torch.distributed`` once from the launcher's variables (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``/``MASTER_PORT``; gloo on CPU, nccl on CUDA); otherwise it is a one-process
context whose every operation is a no-op, so single-process training is unchanged.

How a round is split (every family: the one engine, learning/engine.py, does the step):

* :func:`shard_round`: each optimizer step's window of ``items_per_step`` items is cut into
  ``world_size`` contiguous blocks, one per rank, so every step is balanced and every rank runs
  the same number of optimizer steps (a rank may hold no item of a short window; it still takes
  part in the step with zero gradients).
* The step's loss is normalised by the *global* sample and token counts
  (:meth:`DataParallel.sum_vector`), and the gradients are **summed** over ranks by one
  all-reduce per parameter before clipping (:meth:`DataParallel.sum_gradients`): the result is
  the gradient of
  the one-process loss over all the step's items, not an average of per-rank means (which would
  differ for ``token_mean`` or uneven shares). Every rank then clips and steps identically.

Why an all-reduce and not ``DistributedDataParallel``: the agents generate with Hugging Face
``generate`` (awkward under a DDP wrapper), a step accumulates several chunked forwards
(``forward_batch_size``) whose count differs between ranks, and a rank with no item in a window
has no forward at all, which DDP's hooks would wait for forever.

Evaluation (:func:`cmlrl_agents.runs.evaluation.collect_eval_trees`): each rank rolls out one
contiguous block of the eval items and every rank gathers all the trees, so the eval metrics are
computed on the union; every rank must call ``evaluate()``. Generated rows draw from sampling
keys of their item, turn and sample (``policies/sampling.py``), so a launch samples what one
process samples, whichever rank generates an item.

Only rank 0 writes: metric files, W&B, plots, rollout-tree pictures, checkpoints and
``save_model``; the others wait at a barrier so that nothing reads a half-written checkpoint.
Resume: every rank loads the same checkpoint folder (a path all ranks can read: one machine or
a shared file system) and takes back its own RNG state (``rng-rank<r>.pt``).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist

__all__ = [
    "DataParallel",
    "aggregate_metrics",
    "data_parallel",
    "shard_round",
    "turn_weights",
]

T = TypeVar("T")


def shard_round(num_items: int, per_step: int, rank: int, world_size: int) -> list[tuple[int, int]]:
    """``(position in the round, step window)`` of the items ``rank`` takes from a round of
    ``num_items``: window ``w`` holds positions ``[w * per_step, (w + 1) * per_step)`` and is
    cut into ``world_size`` contiguous blocks of ``ceil(size / world_size)`` items.

    >>> shard_round(8, 4, 0, 2), shard_round(8, 4, 1, 2)
    ([(0, 0), (1, 0), (4, 1), (5, 1)], [(2, 0), (3, 0), (6, 1), (7, 1)])
    >>> shard_round(3, 4, 1, 2)  # one short window: 2 + 1
    [(2, 0)]
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    if per_step < 1 or num_items < 0:
        raise ValueError(f"per_step={per_step} must be >= 1 and num_items={num_items} >= 0")
    taken: list[tuple[int, int]] = []
    for window, start in enumerate(range(0, num_items, per_step)):
        size = min(per_step, num_items - start)
        block = math.ceil(size / world_size)
        first = start + rank * block
        taken.extend((p, window) for p in range(first, min(first + block, start + size)))
    return taken


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the launch: ``rank`` of ``world_size`` (1: no distribution)."""

    rank: int = 0
    world_size: int = 1

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs and writes files."""
        return self.rank == 0

    def shard(self, items: Sequence[T], per_step: int) -> list[T]:
        """This rank's items of a round (see :func:`shard_round`)."""
        taken = shard_round(len(items), per_step, self.rank, self.world_size)
        return [items[p] for p, _ in taken]

    def windows(self, num_items: int, per_step: int) -> list[list[int]]:
        """Per optimizer step of a round of ``num_items`` (all ranks together), the local item
        slots (indices into this rank's shard) that the step uses; possibly empty."""
        taken = shard_round(num_items, per_step, self.rank, self.world_size)
        out: list[list[int]] = [[] for _ in range(math.ceil(num_items / per_step))]
        for slot, (_, window) in enumerate(taken):
            out[window].append(slot)
        return out

    def sum(self, value: float) -> float:
        """``value`` summed over ranks (a float64 all-reduce; exact for counts)."""
        if not self.enabled:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return float(t.item())

    def sum_vector(self, values: Sequence[float]) -> list[float]:
        """Each of ``values`` summed over ranks, in one float64 all-reduce."""
        if not self.enabled:
            return [float(v) for v in values]
        t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self._device())
        dist.all_reduce(t)
        return t.tolist()

    def reduce_tensors(self, summed: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``summed`` added up and ``top`` maximised over the ranks, where they are (no host
        read); moved to the process group's device first when that differs."""
        if not self.enabled:
            return summed, top
        device = self._device()
        summed, top = summed.to(device), top.to(device)
        dist.all_reduce(summed)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return summed, top

    def gather(self, value: T) -> list[T]:
        """Every rank's ``value`` (any picklable object), in rank order."""
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def sum_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum ``.grad`` over ranks, in place; a missing gradient counts as zeros (a rank with no
        sample in this step)."""
        if not self.enabled:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    def broadcast_parameters(self, modules: Iterable[torch.nn.Module]) -> None:
        """Rank 0's parameters and buffers to every rank (identical starting weights even where
        initialisation is random, e.g. fresh LoRA adapters or value heads)."""
        if not self.enabled:
            return
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                with torch.no_grad():
                    dist.broadcast(tensor.data, src=0)

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def _device(self) -> torch.device:
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def _env_int(name: str, default: str) -> int:
    raw = os.environ.get(name, default)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(
            f"environment variable {name}={raw!r} is not an integer; it is set by torchrun / "
            "accelerate launch, unset it to train in one process"
        ) from None


@functools.cache
def data_parallel() -> DataParallel:
    """This process's :class:`DataParallel`, from ``WORLD_SIZE``/``RANK`` (set by torchrun and
    ``accelerate launch``); the process group is initialised on the first call when
    ``WORLD_SIZE > 1`` and none exists (gloo, or nccl when CUDA is available)."""
    world, rank = _env_int("WORLD_SIZE", "1"), _env_int("RANK", "0")
    if world < 1 or not 0 <= rank < world:
        raise ValueError(
            f"WORLD_SIZE={world}, RANK={rank}: need WORLD_SIZE >= 1 and 0 <= RANK < WORLD_SIZE"
        )
    if world == 1:
        return DataParallel()
    if not dist.is_initialized():
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(_env_int("LOCAL_RANK", "0"))
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return DataParallel(rank=dist.get_rank(), world_size=dist.get_world_size())


def aggregate_metrics(
    parallel: DataParallel, metrics: Mapping[str, float], weights: Mapping[str, float]
) -> dict[str, float]:
    """Each key over the ranks that have it: a ``..._min`` / ``..._max`` key the minimum /
    maximum, any other the mean weighted by ``weights[key]`` (e.g. the rank's number of joint
    actions of that turn; 1 where absent): the all-rank mean of a per-rank mean."""
    if not parallel.enabled:
        return dict(metrics)
    totals: dict[str, list[float]] = {}
    extremes: dict[str, list[float]] = {}
    for rank_metrics, rank_weights in parallel.gather((dict(metrics), dict(weights))):
        for key, value in rank_metrics.items():
            if key.endswith(("_min", "_max")):
                extremes.setdefault(key, []).append(value)
                continue
            w = rank_weights.get(key, 1.0)
            acc = totals.setdefault(key, [0.0, 0.0])
            acc[0] += w * value
            acc[1] += w
    out = {key: s / w for key, (s, w) in totals.items() if w > 0}
    out.update({k: (min(v) if k.endswith("_min") else max(v)) for k, v in extremes.items()})
    return out


def turn_weights(keys: Iterable[str], counts: Mapping[int, int]) -> dict[str, float]:
    """For :func:`aggregate_metrics`: a ``turn_k/`` metric weighs this rank's number of joint
    actions of turn ``k`` (``counts[k]``, 0 when it played none); other keys weigh 1."""
    out = {}
    for key in keys:
        match = re.search(r"(?:^|/)turn_(\d+)/", key)
        if match:
            out[key] = float(counts.get(int(match.group(1)), 0))
    return out
