"""A policy step's metrics, read from the sums and totals the engine reduced over the step's
chunks and ranks: per agent its loss and gradient norm, the KL to the reference per turn, and
the per-token means (entropy, ratio, clip fraction, approximate KL, importance weight)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cmlrl_agents.learning.policy_loss import PolicyObjective

__all__ = ["policy_metrics"]


def policy_metrics(
    stats: Mapping[str, float],
    totals: Mapping[str, float],
    agents: Sequence[int],
    objective: PolicyObjective,
    num_turns: int,
) -> dict[str, dict[str, float]]:
    """Per agent ``agent_i``: the step's metrics from its sums (means per sample or token)."""
    return {f"agent_{a}": _agent_metrics(stats, totals, a, objective, num_turns) for a in agents}


_PER_TOKEN = {
    "entropy_sum": "entropy",
    "ratio_sum": "ratio_mean",
    "clipped": "clipfrac",
    "approx_kl_sum": "approx_kl",
    "is_weight_sum": "is_weight_mean",
}


def _agent_metrics(
    stats: Mapping[str, float],
    totals: Mapping[str, float],
    a: int,
    objective: PolicyObjective,
    num_turns: int,
) -> dict[str, float]:
    prefix = f"agent_{a}/"
    tokens = max(totals[prefix + "tokens"], 1.0)
    m = {"loss": stats[prefix + "loss"], "grad_norm": stats[prefix + "grad_norm"]}
    for t in range(1, num_turns + 1):
        kl, n = stats.get(f"{prefix}turn_{t}/kl_sum"), totals[f"{prefix}turn_{t}/samples"]
        if kl is not None and n > 0:
            m[f"turn_{t}/reference_kl_mean"] = kl / n
            m[f"turn_{t}/reference_kl_penalty_mean"] = objective.kl_coef * kl / n
    for key, name in _PER_TOKEN.items():
        if prefix + key in stats:
            m[name] = stats[prefix + key] / tokens
    for key in ("ratio_max", "is_weight_max", "value_loss"):
        if prefix + key in stats:
            m[key] = stats[prefix + key]
    return m
