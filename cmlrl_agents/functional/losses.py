"""Losses on per-token log-probabilities: policy gradient (plain or PPO-clipped), value, k3 KL.

Pure tensor functions: no model, no tokenizer, no state. Shapes use ``B`` sequences and ``L``
padded completion tokens; ``mask`` is 1 on real completion tokens. Padding positions are
selected away with ``torch.where`` (not multiplied by 0), so whatever sits there, NaN included,
changes neither the loss nor the gradient. NaN/inf on real tokens raises ``ValueError``: the
reference replaced a NaN loss with a constant and silently skipped the update (bug B9).
"""

from __future__ import annotations

import torch
from torch import Tensor

from cmlrl_agents._checks import check_finite, check_float

__all__ = [
    "AGGREGATIONS",
    "kl_k3",
    "masked_mean",
    "masked_sum",
    "policy_gradient_loss",
    "value_loss",
]

AGGREGATIONS: tuple[str, ...] = ("sequence_sum", "token_mean")
"""Token aggregations accepted by :func:`policy_gradient_loss`."""


def _bool_mask(mask: object, shape: tuple[int, ...]) -> Tensor:
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if tuple(mask.shape) != shape:
        raise ValueError(f"mask must have shape {shape} (like logprobs), got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask must hold only 0 and 1 (1 on real completion tokens)")
    return mask != 0


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``x`` where ``mask`` is 1, over ``dim`` (all elements when ``None``).

    ``mask`` has the shape of ``x``, bool or 0/1. Masked entries are dropped, not multiplied by
    0, so a NaN there does not leak into the result or its gradient.
    """
    check_float("x", x)
    valid = _bool_mask(mask, tuple(x.shape))
    kept = torch.where(valid, x, torch.zeros_like(x))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``x`` over the entries where ``mask`` is 1, over ``dim`` (all when ``None``).

    Raises ``ValueError`` when a reduced slice has no unmasked entry (its mean is undefined).
    """
    total = masked_sum(x, mask, dim)
    valid = _bool_mask(mask, tuple(x.shape))
    count = valid.sum() if dim is None else valid.sum(dim=dim)
    if bool((count == 0).any()):
        raise ValueError(
            f"mask has no 1 in some slice reduced over dim={dim}; the mean there is undefined"
        )
    return total / count.to(total.dtype)


def _check_policy_inputs(
    logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    aggregation: str,
    old_logprobs: Tensor | None,
    clip_range: float | None,
) -> Tensor:
    """Validate :func:`policy_gradient_loss`'s arguments; return the mask as bool."""
    check_float("logprobs", logprobs, dim=2)
    shape = tuple(logprobs.shape)
    valid = _bool_mask(mask, shape)
    check_float("advantages", advantages, shape=shape[:1])
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if (old_logprobs is None) != (clip_range is None):
        raise ValueError(
            "old_logprobs and clip_range go together: pass both for the clipped surrogate or "
            f"neither; got old_logprobs={'None' if old_logprobs is None else 'tensor'}, "
            f"clip_range={clip_range}"
        )
    if not bool(valid.any()):
        raise ValueError(
            "mask has no real token (all 0); every completion is empty — check the completion masks"
        )
    check_finite("logprobs", logprobs, valid)
    check_finite("advantages", advantages)
    if old_logprobs is not None:
        check_float("old_logprobs", old_logprobs, shape=shape)
        check_finite("old_logprobs", old_logprobs, valid)
    if clip_range is not None and not clip_range > 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    return valid


def policy_gradient_loss(
    logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    aggregation: str = "sequence_sum",
    old_logprobs: Tensor | None = None,
    clip_range: float | None = None,
) -> Tensor:
    """Policy-gradient loss (REINFORCE, or PPO's clipped surrogate), a scalar to minimise.

    Per real token the loss is ``s_it = -A_i * logp_it``, or with ``old_logprobs`` and
    ``clip_range`` the clipped surrogate ``s_it = -min(ratio * A_i, clip(ratio, 1-c, 1+c) * A_i)``
    with ``ratio = exp(logp_it - old_it)``. Aggregation over tokens and sequences:

    - ``"sequence_sum"``: ``mean_i sum_t s_it`` (MAGRPO's objective: sequence log-prob summed,
      so longer completions carry more weight).
    - ``"token_mean"``: ``sum_{i,t} s_it / sum(mask)`` (Dr.GRPO/DAPO-style token mean).

    At ``ratio == 1`` the clipped form has the same gradient as the plain one (its value is
    ``-A_i`` per token instead of ``-A_i * logp_it``).

    Args:
        logprobs: ``[B, L]`` float, log-probs of the sampled tokens under the current policy.
        mask: ``[B, L]`` bool or 0/1; 1 on real completion tokens. Must contain at least one 1.
        advantages: ``[B]`` float, one per sequence. Detached: it is a weight, not a parameter.
        aggregation: one of :data:`AGGREGATIONS`.
        old_logprobs: ``[B, L]`` float, log-probs at sampling time (detached); needs ``clip_range``.
        clip_range: ``c > 0``; needs ``old_logprobs``.

    Returns:
        A 0-d tensor carrying gradient to ``logprobs``.
    """
    valid = _check_policy_inputs(logprobs, mask, advantages, aggregation, old_logprobs, clip_range)
    zeros = torch.zeros_like(logprobs)
    logp = torch.where(valid, logprobs, zeros)
    adv = advantages.detach().unsqueeze(1)
    if old_logprobs is None or clip_range is None:
        per_token = -adv * logp
    else:
        old = torch.where(valid, old_logprobs.detach(), zeros)
        ratio = torch.exp(logp - old)
        clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
    per_token = torch.where(valid, per_token, zeros)

    if aggregation == "sequence_sum":
        loss = per_token.sum(dim=1).mean()
    else:
        loss = per_token.sum() / valid.sum().to(per_token.dtype)
    # exp(logp - old) can overflow even when every input is finite.
    check_finite("policy loss (ratio overflow? logprobs far from old_logprobs)", loss)
    return loss


def value_loss(
    values: Tensor,
    targets: Tensor,
    old_values: Tensor | None = None,
    clip_range: float | None = None,
) -> Tensor:
    """Mean squared error of the critic, optionally PPO-style clipped around the old values.

    Plain: ``mean((v - t)^2)``.
    Clipped: ``mean(max((v - t)^2, (old + clip(v - old, -c, c) - t)^2))``: the pessimistic
    of the two, so an update gains nothing from moving a value more than ``c`` away from ``old``.

    Args:
        values: ``[B]`` float, current critic outputs (carry gradient).
        targets: ``[B]`` float, regression targets (detached).
        old_values: ``[B]`` float, critic outputs at rollout time (detached); needs ``clip_range``.
        clip_range: ``c > 0``; needs ``old_values``.

    Returns:
        A 0-d tensor.
    """
    check_float("values", values, dim=1)
    check_float("targets", targets, shape=tuple(values.shape))
    if (old_values is None) != (clip_range is None):
        raise ValueError(
            "old_values and clip_range go together: pass both for the clipped loss or neither; "
            f"got old_values={'None' if old_values is None else 'tensor'}, clip_range={clip_range}"
        )
    if values.numel() == 0:
        raise ValueError("values is empty (shape (0,)); there is nothing to regress")
    check_finite("values", values)
    check_finite("targets", targets)
    err = (values - targets.detach()) ** 2
    if old_values is None:
        return err.mean()
    check_float("old_values", old_values, shape=tuple(values.shape))
    check_finite("old_values", old_values)
    if not clip_range > 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    old = old_values.detach()
    clipped = old + torch.clamp(values - old, -clip_range, clip_range)
    return torch.maximum(err, (clipped - targets.detach()) ** 2).mean()


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence KL(policy || reference) estimate, the k3 estimator summed over real tokens.

    Per token ``exp(d) - d - 1`` with ``d = ref_logp - logp``: unbiased for the KL when tokens
    are sampled from the policy, and never negative (``e^d >= 1 + d``), unlike ``-d``.
    See http://joschu.net/blog/kl-approx.html.

    Args:
        logprobs: ``[B, L]`` float, log-probs of the sampled tokens under the policy.
        ref_logprobs: ``[B, L]`` float, the same tokens under the reference model.
        mask: ``[B, L]`` bool or 0/1; 1 on real completion tokens.

    Returns:
        ``[B]``; 0 for a sequence whose tokens have equal log-probs (or no real token).
    """
    check_float("logprobs", logprobs, dim=2)
    shape = tuple(logprobs.shape)
    check_float("ref_logprobs", ref_logprobs, shape=shape)
    valid = _bool_mask(mask, shape)
    check_finite("logprobs", logprobs, valid)
    check_finite("ref_logprobs", ref_logprobs, valid)
    zeros = torch.zeros_like(logprobs)
    d = torch.where(valid, ref_logprobs - logprobs, zeros)
    return torch.where(valid, torch.exp(d) - d - 1.0, zeros).sum(dim=1)
