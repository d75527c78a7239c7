"""The one gradient step every learner takes: chunked forwards, one normalisation, one read.

Every family's optimizer step is the same sequence, written once here:

1. zero the gradients of the step's optimizers;
2. count the step's units (samples, tokens, pairs, states: whatever the loss divides by) on
   the host, and sum the counts over the ranks of a data parallel launch in one all-reduce, so
   that every chunk's loss is normalised by the *step's* totals (``totals``): the chunks' and
   the ranks' losses then add up to the loss of the whole step in one process;
3. for each chunk (``forward_batch_size`` rows at most): its loss (under bfloat16 autocast
   with ``bf16``), then ``backward``;
4. sum the gradients over the ranks (one all-reduce per parameter: see foundation/distributed.py);
5. each optimizer's gradient norm; the step's statistics summed (and maxima taken) over the
   ranks on the device, then read on the host ONCE, with the norms: each read waits for the
   device, so the chunks never read;
6. refuse a non-finite loss or gradient norm (nothing is stepped), clip, step, schedule.

The learner says what a chunk is and what its loss is (:class:`StepPlan`); the engine owns
everything else, so chunking, ranks and clipping behave alike in every family.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch
from torch import Tensor

from cmlrl_agents.foundation.distributed import DataParallel

__all__ = ["ChunkLoss", "StepEngine", "StepPlan", "StepResult", "mean_metrics"]

C = TypeVar("C")


@dataclass(frozen=True)
class ChunkLoss:
    """One chunk's share of the step: ``loss`` (with gradient, already divided by the step's
    totals), and detached 0-d statistics to add up (``sums``) or take the maximum of
    (``maxima``) over the step's chunks and ranks."""

    loss: Tensor
    sums: Mapping[str, Tensor] = field(default_factory=dict)
    maxima: Mapping[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class StepPlan(Generic[C]):
    """What one optimizer step is made of.

    ``count_keys``, ``sum_keys`` and ``max_keys`` are declared up front because every rank of a
    launch must reduce the same vector, also a rank whose share of this step is empty.
    """

    optimizers: Mapping[str, torch.optim.Optimizer]
    """The optimizers this step updates, by name (``agent_0``, ``critic_0``, ...)."""
    chunks: Sequence[C]
    count: Callable[[C], Mapping[str, float]]
    """A chunk's units by key (host numbers: never a device read)."""
    loss: Callable[[C, Mapping[str, float]], ChunkLoss]
    """A chunk's :class:`ChunkLoss`, given the step's totals of every count key."""
    count_keys: Sequence[str]
    sum_keys: Sequence[str] = ()
    max_keys: Sequence[str] = ()


@dataclass(frozen=True)
class StepResult:
    """A step's statistics on the host: ``stats`` holds every sum and maximum (over chunks and
    ranks) and ``<optimizer>/grad_norm`` (before clipping); ``totals`` the counts."""

    stats: dict[str, float]
    totals: dict[str, float]


class StepEngine:
    """Takes optimizer steps (:meth:`step`) for one process of a (possibly data parallel) run.

    ``bf16``: each chunk's loss (its forwards) runs under bfloat16 autocast, the backward
    outside it, as PyTorch prescribes; weights, gradients and optimizer states stay float32.
    A learner's passes without gradient whose numbers the loss compares with (a round's old
    log-probs, DPO's reference log-probs) run under :meth:`autocast` too, so they are the
    same function as the loss's.
    """

    def __init__(self, parallel: DataParallel, *, bf16: bool = False) -> None:
        self.parallel = parallel
        self.bf16 = bf16

    def autocast(self, device: torch.device) -> AbstractContextManager[object]:
        """The training passes' precision on ``device``: bfloat16 autocast, or nothing."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)

    def step(
        self,
        plan: StepPlan[C],
        *,
        max_grad_norm: float | None,
        schedulers: Mapping[str, torch.optim.lr_scheduler.LRScheduler] | None = None,
    ) -> StepResult:
        """One optimizer step of every optimizer of ``plan`` (see the module docstring)."""
        for optimizer in plan.optimizers.values():
            optimizer.zero_grad(set_to_none=True)
        totals = self._totals(plan)
        sums: dict[str, Tensor] = {}
        maxima: dict[str, Tensor] = {}
        device = _device(plan.optimizers)
        for chunk in plan.chunks:
            with self.autocast(device):
                part = plan.loss(chunk, totals)
            part.loss.backward()
            _accumulate(sums, part.sums, torch.add, plan.sum_keys, "sum_keys")
            _accumulate(maxima, part.maxima, torch.maximum, plan.max_keys, "max_keys")
        names = sorted(plan.optimizers)  # every rank reduces the optimizers in one order
        params = {name: _params(plan.optimizers[name]) for name in names}
        self.parallel.sum_gradients(p for name in names for p in params[name])
        norms = {name: _grad_norm(params[name]) for name in names}
        stats = self._read(plan, sums, maxima, norms, device)
        _check_finite(stats, names)
        for name in names:
            if max_grad_norm is not None and params[name]:
                torch.nn.utils.clip_grads_with_norm_(params[name], max_grad_norm, norms[name])
            plan.optimizers[name].step()
            plan.optimizers[name].zero_grad(set_to_none=True)
            if schedulers and name in schedulers:
                schedulers[name].step()
        return StepResult(stats, totals)

    def _totals(self, plan: StepPlan[C]) -> dict[str, float]:
        local = dict.fromkeys(plan.count_keys, 0.0)
        for chunk in plan.chunks:
            for key, value in plan.count(chunk).items():
                if key not in local:
                    raise KeyError(f"count key {key!r} is not in the plan's count_keys")
                local[key] += float(value)
        keys = list(plan.count_keys)
        return dict(zip(keys, self.parallel.sum_vector([local[k] for k in keys]), strict=True))

    def _read(
        self,
        plan: StepPlan[C],
        sums: Mapping[str, Tensor],
        maxima: Mapping[str, Tensor],
        norms: Mapping[str, Tensor],
        device: torch.device,
    ) -> dict[str, float]:
        """Sums and maxima reduced over the ranks on the device, then one host read with the
        gradient norms (identical on every rank after the gradient all-reduce)."""
        zero, low = torch.zeros((), device=device), torch.full((), -math.inf, device=device)
        summed = _stack([sums.get(k, zero) for k in plan.sum_keys], device)
        top = _stack([maxima.get(k, low) for k in plan.max_keys], device)
        summed, top = self.parallel.reduce_tensors(summed, top)
        norm_values = _stack([norms[name] for name in sorted(norms)], device)
        flat = torch.cat([summed.to(device), top.to(device), norm_values]).tolist()
        keys = [*plan.sum_keys, *plan.max_keys, *(f"{name}/grad_norm" for name in sorted(norms))]
        return dict(zip(keys, flat, strict=True))


def _stack(values: Sequence[Tensor], device: torch.device) -> Tensor:
    if not values:
        return torch.zeros(0, dtype=torch.float64, device=device)
    return torch.stack([v.to(device, torch.float64) for v in values])


def _params(optimizer: torch.optim.Optimizer) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _grad_norm(params: Sequence[torch.nn.Parameter]) -> Tensor:
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        device = params[0].device if params else torch.device("cpu")
        return torch.zeros((), device=device)
    return torch.nn.utils.get_total_norm(grads)


def _device(optimizers: Mapping[str, torch.optim.Optimizer]) -> torch.device:
    """Where the step's statistics meet: the first optimizer's parameters' device."""
    for optimizer in optimizers.values():
        for p in _params(optimizer):
            return p.device
    return torch.device("cpu")


def _accumulate(
    into: dict[str, Tensor],
    new: Mapping[str, Tensor],
    combine: Callable[[Tensor, Tensor], Tensor],
    declared: Sequence[str],
    label: str,
) -> None:
    for key, value in new.items():
        if key not in declared:
            raise KeyError(f"statistic {key!r} is not in the plan's {label}")
        value = value.detach()
        into[key] = value if key not in into else combine(into[key], value.to(into[key].device))


def _check_finite(stats: Mapping[str, float], names: Sequence[str]) -> None:
    """A NaN or infinite loss or gradient norm would step every weight to NaN (or skip the
    update silently): refuse it, before any optimizer steps."""
    for name in names:
        norm = stats[f"{name}/grad_norm"]
        if not math.isfinite(norm):
            raise FloatingPointError(
                f"{name}'s gradient norm is {norm} (a NaN or infinite loss or log-prob): the "
                "step was not taken. Check the rewards and the model's outputs for NaN/inf, or "
                "lower the learning rate."
            )
    bad = {k: v for k, v in stats.items() if k.endswith("loss") and not math.isfinite(v)}
    if bad:
        raise FloatingPointError(f"the step's loss is not finite ({bad}): the step was not taken.")


def mean_metrics(steps: Mapping[str, list[float]]) -> dict[str, float]:
    """Each key's mean over the round's steps."""
    return {key: sum(values) / len(values) for key, values in steps.items()}
