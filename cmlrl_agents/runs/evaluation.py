"""The standard evaluation metrics of SPEC §5 from one-sample-per-turn rollout trees (pure)."""

from __future__ import annotations

import numpy as np

from cmlrl_agents.functional.returns import ended_chain_returns
from cmlrl_agents.runs.rollout import RolloutTree

__all__ = ["eval_values", "mean_eval_metrics"]


def mean_eval_metrics(
    trees: list[RolloutTree], threshold: float | None, num_turns: int, discount: float
) -> dict[str, float]:
    """``eval/turn_k/...``: each value of :func:`eval_values` averaged over every tree."""
    sums: dict[str, list[float]] = {}
    for tree in trees:
        for key, value in eval_values(tree, threshold, num_turns, discount).items():
            sums.setdefault(key, []).extend(value)
    return {f"eval/{k}": float(np.mean(v)) for k, v in sums.items()}


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
