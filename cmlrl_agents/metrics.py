"""Metric records shared by the learners and the loop (the names of SPEC §7)."""

from __future__ import annotations

import torch

from cmlrl_agents.rollout import RolloutTree

__all__ = ["turn_metrics"]


def turn_metrics(
    tree: RolloutTree, returns: list[torch.Tensor], prefix: str = ""
) -> dict[str, float]:
    """``turn_k/reward_mean`` and ``turn_k/expected_return`` over every joint action of turn k."""
    metrics = {}
    for level, ret in zip(tree.levels, returns, strict=True):
        metrics[f"{prefix}turn_{level.turn}/reward_mean"] = float(level.rewards.mean())
        metrics[f"{prefix}turn_{level.turn}/expected_return"] = float(ret.mean())
    return metrics
