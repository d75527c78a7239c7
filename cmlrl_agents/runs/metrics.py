"""Metric records shared by the learners and the loop (the names of SPEC §7)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from cmlrl_agents.runs.rollout import RolloutTree

__all__ = ["reward_postfix", "turn_key", "turn_metrics"]


def turn_key(turn: int, name: str, prefix: str = "") -> str:
    """The SPEC §7 name of a per-turn metric: ``turn_k/<name>`` (``turn`` is 1-based)."""
    return f"{prefix}turn_{turn}/{name}"


def reward_postfix(metrics: Mapping[str, float], num_turns: int) -> dict[str, float]:
    """``{"turn_k": reward_mean}`` for the progress bar, looked up by name (never parsed)."""
    keys = {f"turn_{t}": turn_key(t, "reward_mean") for t in range(1, num_turns + 1)}
    return {shown: metrics[key] for shown, key in keys.items() if key in metrics}


def turn_metrics(
    tree: RolloutTree, returns: list[torch.Tensor], prefix: str = ""
) -> dict[str, float]:
    """``turn_k/reward_mean`` and ``turn_k/expected_return`` over every joint action of turn k."""
    metrics = {}
    for level, ret in zip(tree.levels, returns, strict=True):
        metrics[turn_key(level.turn, "reward_mean", prefix)] = float(level.rewards.mean())
        metrics[turn_key(level.turn, "expected_return", prefix)] = float(ret.mean())
    return metrics
