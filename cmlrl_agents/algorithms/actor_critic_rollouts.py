"""Actor-critic rollouts: the tree as chains of turns, GAE over them, and the samples.

Pure bookkeeping over a :class:`~cmlrl_agents.foundation.rollout.RolloutTree` and tensors (no
model): which joint action continues which chain, the GAE advantages and returns of every joint
action, and the
:class:`RolloutSample` records the learner trains on and ``metrics_callback`` reads.

Chains: with ``num_generations = G`` in a single turn, each of an item's G joint actions is its own
one-step chain from the same state. With several turns G must be 1, so every item is one chain
whose length is the number of turns played (an early-ended chain is terminal with its absorbing
reward: :mod:`cmlrl_agents.learning.credit`). With G > 1 over several turns every turn-1 sample
would head G**(T-1) chains (MAGRPO trains on such trees instead). GAE itself is
:func:`~cmlrl_agents.learning.credit.chain_credit`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from cmlrl_agents.foundation.distributed import DataParallel
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.learning.batch import PolicyRow

__all__ = [
    "RolloutSample",
    "StateKey",
    "agent_rollouts",
    "normalized",
    "value_metrics",
]

StateKey = tuple[int, int]  # (level index, branch): one state of the rollout tree


@dataclasses.dataclass(frozen=True)
class RolloutSample:
    """One completion of one agent, with what the learner made of it."""

    agent_idx: int
    prompt: str
    completion: str
    turn: int
    generation: int
    item: Mapping[str, Any]
    item_index: int | None
    reward: float
    returns: float
    value: float
    advantage: float
    normalized_advantage: float | None
    prompt_ids: tuple[int, ...] = dataclasses.field(repr=False)
    completion_ids: tuple[int, ...] = dataclasses.field(repr=False)
    item_slot: int = dataclasses.field(repr=False)
    state_key: StateKey = dataclasses.field(repr=False)
    finished: bool = dataclasses.field(default=True, repr=False)
    sampler_logprobs: tuple[float, ...] | None = dataclasses.field(default=None, repr=False)

    def row(self) -> PolicyRow:
        """This sample as a row of the actor's policy step (with its value-head target)."""
        advantage = (
            self.advantage if self.normalized_advantage is None else self.normalized_advantage
        )
        return PolicyRow(
            agent=self.agent_idx,
            item_slot=self.item_slot,
            turn=self.turn,
            prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids,
            advantage=advantage,
            finished=self.finished,
            sampler_logprobs=self.sampler_logprobs,
            value_target=self.returns,
            value_old=self.value,
        )

    @property
    def metadata(self) -> dict[str, Any]:
        """``turn`` (1-based), ``generation``, ``item``, ``item_index``, ``reward`` (processed),
        ``return`` (GAE target), ``value`` (V(s) at rollout), ``advantage`` (GAE) and
        ``normalized_advantage`` (what the loss used; None in evaluation)."""
        return {
            "turn": self.turn,
            "generation": self.generation,
            "item": self.item,
            "item_index": self.item_index,
            "reward": self.reward,
            "return": self.returns,
            "value": self.value,
            "advantage": self.advantage,
            "normalized_advantage": self.normalized_advantage,
        }


def agent_rollouts(
    tree: RolloutTree,
    agent: int,
    state_values: list[torch.Tensor],
    advantages: list[torch.Tensor],
    returns: list[torch.Tensor],
) -> list[RolloutSample]:
    """Every completion ``agent`` gave in ``tree``, in level, branch, joint-action order."""
    samples = []
    for t, level in enumerate(tree.levels):
        for b, state in enumerate(level.states):
            for j, joint in enumerate(level.joints):
                completion = level.completions[agent][b][joint[agent]]
                samples.append(
                    RolloutSample(
                        agent,
                        state.prompts[agent],
                        completion.text,
                        level.turn,
                        joint[agent],
                        state.item,
                        state.item_index,
                        float(level.rewards[b, j]),
                        float(returns[t][b, j]),
                        float(state_values[t][b]),
                        float(advantages[t][b, j]),
                        None,
                        completion.prompt_ids,
                        completion.completion_ids,
                        level.item_slot[b],
                        (t, b),
                        completion.finished,
                        completion.sampler_logprobs,
                    )
                )
    return samples


def normalized(samples: list[RolloutSample], parallel: DataParallel) -> list[RolloutSample]:
    """``normalized_advantage`` = the z-score of each advantage over ``samples`` (one agent's
    round; under torchrun over every rank's share, so the result is the one-process one).

    The config refuses rounds of fewer than two samples (``advantage_normalization`` with
    ``rollout_buffer_size * num_generations < 2``), whose z-score would be 0 everywhere.
    """
    values = [s.advantage for s in samples]
    count, total, squares = parallel.sum_vector(
        [len(values), sum(values), sum(v * v for v in values)]
    )
    if count < 2:
        raise ValueError(
            f"advantage normalization over a round of {int(count)} sample(s) is undefined; "
            "raise rollout_buffer_size (or num_generations), or set advantage_normalization=False."
        )
    mean = total / count
    std = max(squares / count - mean * mean, 0.0) ** 0.5
    return [
        dataclasses.replace(s, normalized_advantage=(s.advantage - mean) / (std + 1e-8))
        for s in samples
    ]


def value_metrics(rows: Mapping[str, list[tuple[float, float]]]) -> dict[str, float]:
    """``<prefix>/value_mean`` and ``<prefix>/explained_variance`` per critic (``rows`` maps its
    metric prefix to its samples' (rollout-time value, GAE return) pairs), and both pooled over
    every critic without a prefix.

    Explained variance is stable-baselines3's ``1 - Var[R - V] / Var[R]`` of the rollout-time
    values against the GAE returns; it is left out where undefined (all returns equal, up to
    float rounding).
    """
    metrics: dict[str, float] = {}
    all_values, all_targets = [], []
    for prefix, pairs in rows.items():
        values = np.array([v for v, _ in pairs])
        targets = np.array([r for _, r in pairs])
        all_values.append(values)
        all_targets.append(targets)
        metrics.update(_value_stats(f"{prefix}/", values, targets))
    metrics.update(_value_stats("", np.concatenate(all_values), np.concatenate(all_targets)))
    return metrics


def _value_stats(prefix: str, values: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    # Imported here: stable-baselines3 pulls in gymnasium and takes seconds to import.
    from stable_baselines3.common.utils import explained_variance

    stats = {f"{prefix}value_mean": float(values.mean())}
    # GAE returns are advantage + value, so equal rewards give returns equal only up to float
    # rounding, and a 1e-15 variance would make the ratio meaningless rather than NaN.
    if np.ptp(targets) > 1e-6 * max(1.0, float(np.abs(targets).max())):
        stats[f"{prefix}explained_variance"] = float(explained_variance(values, targets))
    return stats
