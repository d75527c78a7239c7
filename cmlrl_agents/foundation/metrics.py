"""Metric records shared by the learners and the loop (the names of SPEC §7)."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["KL_METRICS", "kl_turn_means", "kl_turn_stats", "reward_postfix", "turn_key"]


def turn_key(turn: int, name: str, prefix: str = "") -> str:
    """The SPEC §7 name of a per-turn metric: ``turn_k/<name>`` (``turn`` is 1-based)."""
    return f"{prefix}turn_{turn}/{name}"


def reward_postfix(metrics: Mapping[str, float], num_turns: int) -> dict[str, float]:
    """``{"turn_k": reward_mean}`` for the progress bar, looked up by name (never parsed)."""
    keys = {f"turn_{t}": turn_key(t, "reward_mean") for t in range(1, num_turns + 1)}
    return {shown: metrics[key] for shown, key in keys.items() if key in metrics}


KL_METRICS = ("reference_kl_mean", "reference_kl_penalty_mean")


def kl_turn_stats(kl_by_turn: Mapping[int, list[float]], coef: float) -> dict[str, float]:
    """``turn_k/reference_kl_mean`` and ``…_penalty_mean`` from per-sample KLs by turn."""
    stats = {}
    for turn, values in kl_by_turn.items():
        mean = sum(values) / len(values)
        stats[turn_key(turn, "reference_kl_mean")] = mean
        stats[turn_key(turn, "reference_kl_penalty_mean")] = coef * mean
    return stats


def kl_turn_means(
    metrics: Mapping[str, float], num_agents: int, num_turns: int
) -> dict[str, float]:
    """Team means of the per-agent ``agent_i/turn_k/reference_kl_*`` metrics under the seed's
    ``turn_k/…`` names, for the turns every agent has (names looked up, never parsed)."""
    out: dict[str, float] = {}
    for turn in range(1, num_turns + 1):
        for name in KL_METRICS:
            key = turn_key(turn, name)
            values = [metrics.get(f"agent_{a}/{key}") for a in range(num_agents)]
            present = [v for v in values if v is not None]
            if len(present) == len(values):
                out[key] = sum(present) / num_agents
    return out
