"""Evaluation: the one-sample-per-turn rollout trees of the eval items (sharded over the ranks
of a torchrun launch), the standard metrics from them (pure), and :class:`Evaluator`, the
trainer's collaborator that runs it without touching training.

Evaluation never changes training: its rows draw from their own sampling keys (an eval key
space of the run's seed, :func:`~cmlrl_agents.policies.sampling.row_key`), and every global
random stream (python, numpy, torch CPU and CUDA) is restored after it, so a run with
evaluation on ends with the weights of the same run with evaluation off.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cmlrl_agents.foundation.distributed import DataParallel
from cmlrl_agents.foundation.rollout import GroupStepEnv, RolloutTree, collect_tree
from cmlrl_agents.functional.returns import ended_chain_returns
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.generation import GenerationBackend
from cmlrl_env import CoMLRLEnv

__all__ = [
    "Evaluator",
    "collect_eval_trees",
    "eval_values",
    "isolated_rng",
    "mean_eval_metrics",
]


def collect_eval_trees(
    env: GroupStepEnv,
    agents: Sequence[Any],
    items: Sequence[tuple[int, Mapping[str, Any]]],
    batch_size: int,
    sampling: Sequence[SamplingConfig],
    backend: GenerationBackend,
    parallel: DataParallel,
    sample_key: int | None = None,
) -> list[RolloutTree]:
    """One response per agent per turn on ``items`` (``(index, item)``, eval order), rolled out
    ``batch_size`` items per tree. Under torchrun each rank rolls out one contiguous block of
    the items and every rank receives every rank's trees, in item order, so that the metrics
    computed from them are the one-process metrics (with deterministic generation) and each
    item is generated once. Every rank must call it (it gathers)."""
    mine = parallel.shard(items, per_step=max(len(items), 1))
    trees = [
        collect_tree(
            env,
            agents,
            [(item, index) for index, item in mine[start : start + batch_size]],
            num_generations=1,
            sampling=sampling,
            backend=backend,
            sample_key=sample_key,
        )
        for start in range(0, len(mine), batch_size)
    ]
    return [tree for rank_trees in parallel.gather(trees) for tree in rank_trees]


def mean_eval_metrics(
    trees: list[RolloutTree], threshold: float | None, num_turns: int, discount: float
) -> dict[str, float]:
    """``eval/turn_k/...``: each value of :func:`eval_values` averaged over every tree, and
    ``eval/turn_k/reward_sem``, the standard error of ``reward_mean`` (the sample standard
    deviation over the square root of the count; only from 2 items on), for error bars."""
    sums: dict[str, list[float]] = {}
    for tree in trees:
        for key, value in eval_values(tree, threshold, num_turns, discount).items():
            sums.setdefault(key, []).extend(value)
    metrics = {f"eval/{k}": float(np.mean(v)) for k, v in sums.items()}
    for key, values in sums.items():
        if key.endswith("/reward_mean") and len(values) > 1:
            sem = np.std(values, ddof=1) / np.sqrt(len(values))
            metrics[f"eval/{key.removesuffix('_mean')}_sem"] = float(sem)
    return metrics


def eval_values(
    tree: RolloutTree, threshold: float | None, num_turns: int, discount: float
) -> dict[str, list[float]]:
    """Per turn, over the items training's early termination keeps open (as in training,
    so train and eval agree: the reference's B5): ``reward_mean``, ``expected_return``
    (an ended item holds its reward); over every played item: ``reward_mean_all``; and the
    share of items still open, ``open_fraction``."""
    chains: dict[int, list[float]] = {}
    for level in tree.levels:  # one sample per turn: branch b is one item's chain
        for slot, row in zip(level.item_slot, level.outcomes, strict=True):
            chains.setdefault(slot, []).append(row[0].reward)
    values: dict[str, list[float]] = {}
    can_end = threshold is not None and num_turns > 1
    for chain in chains.values():
        returns = ended_chain_returns(chain, num_turns, threshold, discount)
        for t, reward in enumerate(chain):
            key = f"turn_{t + 1}/"
            if can_end:
                values.setdefault(key + "reward_mean_all", []).append(reward)
                values.setdefault(key + "open_fraction", []).append(float(t < len(returns)))
            if t < len(returns):
                values.setdefault(key + "reward_mean", []).append(reward)
                values.setdefault(key + "expected_return", []).append(returns[t])
    return values


@contextmanager
def isolated_rng() -> Iterator[None]:
    """Run a block without changing any global random stream (python, numpy, torch, CUDA)."""
    python, numpy_state = random.getstate(), np.random.get_state()
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            random.setstate(python)
            np.random.set_state(numpy_state)


@dataclass
class Evaluator:
    """What evaluation needs, held once: the eval env (early termination off, so every turn
    is played), the agents, the generation backend, the launch, and the task's training
    threshold and turns (the standard metrics score each item as training would)."""

    env: CoMLRLEnv | None
    agents: Sequence[Any]
    backend: GenerationBackend
    parallel: DataParallel
    threshold: float | None
    num_turns: int

    def trees(
        self,
        items: Sequence[tuple[int, Mapping[str, Any]]],
        batch_size: int,
        sampling: Sequence[SamplingConfig],
        sample_key: int,
    ) -> list[RolloutTree]:
        """The eval items' trees, rolled out without touching any global random stream."""
        assert self.env is not None
        with isolated_rng():
            return collect_eval_trees(
                self.env,
                self.agents,
                items,
                batch_size,
                sampling,
                self.backend,
                self.parallel,
                sample_key,
            )

    def metrics(self, trees: list[RolloutTree], discount: float) -> dict[str, float]:
        """The standard ``eval/turn_k/...`` metrics of ``trees``."""
        return mean_eval_metrics(trees, self.threshold, self.num_turns, discount)
