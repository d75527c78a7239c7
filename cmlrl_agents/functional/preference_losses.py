"""Preference losses as pure functions on tensors: Bradley-Terry and (multi-agent) DPO.

Both score a pair ``(chosen, rejected)`` by a margin and take ``-log sigmoid(margin)``:

* Bradley-Terry (reward models): the margin is ``r(chosen) - r(rejected)`` of a learned scalar
  reward, so ``P(chosen > rejected) = sigmoid(margin)``.
* DPO (Rafailov et al., 2023): the margin is ``beta * (log pi/pi_ref(chosen) - log
  pi/pi_ref(rejected))``. The frozen reference ``pi_ref`` anchors it: at ``pi == pi_ref`` the margin
  is 0, the loss is ``log 2`` and the gradient is the plain ``beta/2`` push toward chosen. The
  reference's MADPO had no reference term (bug B10), so its "DPO" could drift without bound.

For a team, a joint response's log-probability is the sum of the agents' (the joint policy is
the product of the agents' policies), so the joint DPO margin sums the per-agent log-ratios.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "bradley_terry_loss",
    "dpo_implicit_rewards",
    "dpo_loss",
    "joint_log_ratio",
    "dpo_margin_stats",
    "pair_accuracy",
]


def _same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_a} has shape {tuple(a.shape)} but {name_b} has {tuple(b.shape)}; pass one "
            "value per pair in each."
        )


def bradley_terry_loss(chosen_scores: Tensor, rejected_scores: Tensor) -> Tensor:
    """Mean over pairs of ``-log sigmoid(r_chosen - r_rejected)``."""
    _same_shape("chosen_scores", chosen_scores, "rejected_scores", rejected_scores)
    return -F.logsigmoid(chosen_scores - rejected_scores).mean()


def pair_accuracy(chosen_scores: Tensor, rejected_scores: Tensor) -> float:
    """Share of pairs whose chosen response scores strictly higher (a tie counts as wrong)."""
    _same_shape("chosen_scores", chosen_scores, "rejected_scores", rejected_scores)
    if chosen_scores.numel() == 0:
        raise ValueError("pair_accuracy needs at least one pair.")
    return float((chosen_scores > rejected_scores).float().mean())


def joint_log_ratio(policy_logps: Tensor, reference_logps: Tensor) -> Tensor:
    """``[P]`` joint log-ratio of P joint responses: the sum over the N agents of
    ``log pi_a - log pi_ref_a`` (inputs ``[N, P]``, summed sequence log-probs)."""
    _same_shape("policy_logps", policy_logps, "reference_logps", reference_logps)
    if policy_logps.dim() != 2:
        raise ValueError(
            f"policy_logps must be [num_agents, num_pairs], got shape {tuple(policy_logps.shape)}."
        )
    return (policy_logps - reference_logps).sum(dim=0)


def dpo_implicit_rewards(log_ratio: Tensor, beta: float) -> Tensor:
    """DPO's implicit reward of a response: ``beta * log pi/pi_ref``."""
    return beta * log_ratio


def dpo_loss(chosen_log_ratio: Tensor, rejected_log_ratio: Tensor, beta: float) -> Tensor:
    """Per-pair DPO loss ``-log sigmoid(beta * (chosen_log_ratio - rejected_log_ratio))``.

    The log-ratios are ``log pi(y) - log pi_ref(y)`` (for a team, :func:`joint_log_ratio`).
    Returns ``[P]``; the caller averages (or weights) over pairs.
    """
    _same_shape("chosen_log_ratio", chosen_log_ratio, "rejected_log_ratio", rejected_log_ratio)
    if not beta > 0:
        raise ValueError(f"beta must be > 0, got {beta!r}.")
    return -F.logsigmoid(beta * (chosen_log_ratio - rejected_log_ratio))


def dpo_margin_stats(
    chosen_log_ratio: Tensor, rejected_log_ratio: Tensor, beta: float
) -> dict[str, float]:
    """Detached metrics of a DPO batch: accuracy, margin and mean implicit rewards."""
    chosen = dpo_implicit_rewards(chosen_log_ratio.detach(), beta)
    rejected = dpo_implicit_rewards(rejected_log_ratio.detach(), beta)
    return {
        "accuracy": float((chosen > rejected).float().mean()),
        "margin": float((chosen - rejected).mean()),
        "chosen_reward": float(chosen.mean()),
        "rejected_reward": float(rejected.mean()),
    }
