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
    "aggregate",
    "kl_k3",
    "kl_k3_tokens",
    "masked_mean",
    "masked_sum",
    "policy_gradient_loss",
    "policy_token_losses",
    "ratio_stats",
    "truncated_is_weights",
    "value_loss",
]

AGGREGATIONS: tuple[str, ...] = ("sequence_sum", "token_mean", "sequence_mean")
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
    old_logprobs: Tensor | None,
    clip_range: float | None,
    check: bool,
) -> Tensor:
    """Validate the per-token policy loss's arguments; return the mask as bool.

    Shapes and dtypes are read from tensor metadata. The value checks (0/1 mask, finite entries,
    a real token) read the tensors on the host, which waits for the device: a learner's hot
    path passes ``check=False`` and checks its step's loss once instead (learning/engine.py).
    """
    check_float("logprobs", logprobs, dim=2)
    shape = tuple(logprobs.shape)
    valid = _bool_mask(mask, shape) if check or mask.dtype != torch.bool else mask
    check_float("advantages", advantages, shape=shape[:1])
    if (old_logprobs is None) != (clip_range is None):
        raise ValueError(
            "old_logprobs and clip_range go together: pass both for the clipped surrogate or "
            f"neither; got old_logprobs={'None' if old_logprobs is None else 'tensor'}, "
            f"clip_range={clip_range}"
        )
    if clip_range is not None and not clip_range > 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    if old_logprobs is not None:
        check_float("old_logprobs", old_logprobs, shape=shape)
    if not check:
        return valid
    if not bool(valid.any()):
        raise ValueError(
            "mask has no real token (all 0); every completion is empty — check the completion masks"
        )
    check_finite("logprobs", logprobs, valid)
    check_finite("advantages", advantages)
    if old_logprobs is not None:
        check_finite("old_logprobs", old_logprobs, valid)
    return valid


def policy_token_losses(
    logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    clip_range: float | None = None,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
    check: bool = True,
) -> Tensor:
    """``[B, L]`` per-token policy loss, 0 off the mask; :func:`aggregate` turns it into the
    scalar to minimise.

    Per real token ``s_it = -A_i * logp_it``, or with ``old_logprobs`` and ``clip_range`` PPO's
    clipped surrogate ``-min(ratio * A_i, clip(ratio, 1-c, 1+c) * A_i)`` with
    ``ratio = exp(logp_it - old_it)``; ``is_weights`` (detached, e.g.
    :func:`truncated_is_weights`) multiply that term per token; with ``ref_logprobs`` the k3 KL
    to the reference is added per token, ``+ kl_coef * k3_it`` (TRL's GRPO), so that the KL
    weighs what the policy term weighs under every aggregation.

    At ``ratio == 1`` the clipped form has the gradient of the plain one (its value is ``-A_i``
    per token instead of ``-A_i * logp_it``).

    Args:
        logprobs: ``[B, L]`` float, log-probs of the sampled tokens under the current policy.
        mask: ``[B, L]`` bool or 0/1; 1 on real completion tokens.
        advantages: ``[B]`` float, one per sequence; detached (a weight, not a parameter).
        old_logprobs: ``[B, L]`` log-probs under the policy that sampled (detached).
        clip_range: ``c > 0``; needs ``old_logprobs``.
        is_weights: ``[B, L]`` importance weights of the policy term (detached).
        ref_logprobs: ``[B, L]`` the reference's log-probs of the same tokens.
        kl_coef: the KL term's weight (>= 0).
        check: validate values too (a host read); shapes are always checked.
    """
    valid = _check_policy_inputs(logprobs, mask, advantages, old_logprobs, clip_range, check)
    zeros = torch.zeros_like(logprobs)
    logp = torch.where(valid, logprobs, zeros)
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(1)
    if old_logprobs is None or clip_range is None:
        per_token = -adv * logp
    else:
        old = torch.where(valid, old_logprobs.detach(), zeros)
        ratio = torch.exp(logp - old)
        clipped = torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
        per_token = -torch.minimum(ratio * adv, clipped * adv)
    if is_weights is not None:
        check_float("is_weights", is_weights, shape=tuple(logprobs.shape))
        per_token = per_token * is_weights.detach()
    if ref_logprobs is not None:
        if not kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        per_token = per_token + kl_coef * kl_k3_tokens(logprobs, ref_logprobs, valid, check=check)
    return torch.where(valid, per_token, zeros)


def aggregate(
    token_losses: Tensor,
    mask: Tensor,
    aggregation: str,
    *,
    num_sequences: float | None = None,
    num_tokens: float | None = None,
) -> Tensor:
    """The scalar loss of per-token losses: their sum over ``num_sequences`` (``"sequence_sum"``:
    each sequence's tokens summed, then the mean over sequences), over ``num_tokens``
    (``"token_mean"``: the mean over every real token, DAPO's), or each sequence's
    mean over its own real tokens, summed over ``num_sequences`` (``"sequence_mean"``: the
    original GRPO's, TRL's ``loss_type="grpo"``).

    The counts default to this batch's own; a learner that splits one optimizer step into
    forward chunks (and ranks) passes the step's totals, so the chunks' losses add up to the
    loss of the whole step.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "token_mean":
        return token_losses.sum() / (mask.sum() if num_tokens is None else num_tokens)
    count = token_losses.shape[0] if num_sequences is None else num_sequences
    if aggregation == "sequence_mean":
        # A row's length is its own: chunks of whole rows add up to the step's loss.
        lengths = mask.sum(dim=-1).clamp(min=1).to(token_losses.dtype)
        return (token_losses.sum(dim=-1) / lengths).sum() / count
    return token_losses.sum() / count


def policy_gradient_loss(
    logprobs: Tensor,
    mask: Tensor,
    advantages: Tensor,
    aggregation: str = "sequence_sum",
    old_logprobs: Tensor | None = None,
    clip_range: float | None = None,
    *,
    is_weights: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    kl_coef: float = 0.0,
) -> Tensor:
    """Policy-gradient loss of one batch (REINFORCE, or PPO's clipped surrogate), a scalar to
    minimise: :func:`policy_token_losses` aggregated by :func:`aggregate`.

    - ``"sequence_sum"``: ``mean_i sum_t s_it`` (MAGRPO's objective: sequence log-prob summed,
      so longer completions carry more weight; Dr. GRPO's up to a constant).
    - ``"token_mean"``: ``sum_{i,t} s_it / sum(mask)`` (DAPO's token mean).
    - ``"sequence_mean"``: ``mean_i (sum_t s_it / L_i)`` with ``L_i`` sequence ``i``'s real
      tokens (GRPO's original; each completion weighs the same whatever its length).

    Returns:
        A 0-d tensor carrying gradient to ``logprobs``.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    per_token = policy_token_losses(
        logprobs,
        mask,
        advantages,
        old_logprobs=old_logprobs,
        clip_range=clip_range,
        is_weights=is_weights,
        ref_logprobs=ref_logprobs,
        kl_coef=kl_coef,
    )
    loss = aggregate(per_token, _bool_mask(mask, tuple(logprobs.shape)), aggregation)
    # exp(logp - old) can overflow even when every input is finite.
    check_finite("policy loss (ratio overflow? logprobs far from old_logprobs)", loss)
    return loss


def truncated_is_weights(
    logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, cap: float
) -> Tensor:
    """``[B, L]`` truncated importance weights ``min(exp(logp - sampler_logp), cap)`` (1 off the
    mask): the correction for tokens drawn by a sampler whose probabilities differ from the
    trainer's (vLLM's kernels; TRL's and verl's TIS), truncated so that one token the sampler
    found unlikely cannot dominate the step."""
    check_float("sampler_logprobs", sampler_logprobs, shape=tuple(logprobs.shape))
    if not cap >= 1:
        raise ValueError(f"cap must be >= 1, got {cap}")
    valid = _bool_mask(mask, tuple(logprobs.shape)) if mask.dtype != torch.bool else mask
    ratio = torch.exp(logprobs.detach() - sampler_logprobs).clamp(max=cap)
    return torch.where(valid, ratio, torch.ones_like(ratio))


def ratio_stats(
    logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, clip_range: float
) -> dict[str, Tensor]:
    """Detached sums over the real tokens of a PPO step's diagnostics (CleanRL's and TRL's):
    ``ratio_sum``, ``ratio_max``, ``clipped`` (tokens whose ratio left ``[1-c, 1+c]``) and
    ``approx_kl_sum`` (``(ratio - 1) - log ratio``, never negative); nothing is read on the host."""
    valid = mask.bool()
    log_ratio = torch.where(valid, (logprobs - old_logprobs).detach(), torch.zeros_like(logprobs))
    ratio = torch.exp(log_ratio)
    outside = (ratio < 1 - clip_range) | (ratio > 1 + clip_range)
    return {
        "ratio_sum": torch.where(valid, ratio, 0.0).sum(),
        "ratio_max": torch.where(valid, ratio, float("-inf")).max(),
        "clipped": (outside & valid).sum().to(logprobs.dtype),
        "approx_kl_sum": torch.where(valid, ratio - 1 - log_ratio, 0.0).sum(),
    }


def value_loss(
    values: Tensor,
    targets: Tensor,
    old_values: Tensor | None = None,
    clip_range: float | None = None,
    *,
    check: bool = True,
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
        check: check the values are finite (a host read; the learners check the step's loss
            once instead).

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
    if check:
        check_finite("values", values)
        check_finite("targets", targets)
    err = (values - targets.detach()) ** 2
    if old_values is None or clip_range is None:  # both or neither (checked above)
        return err.mean()
    check_float("old_values", old_values, shape=tuple(values.shape))
    if check:
        check_finite("old_values", old_values)
    if not clip_range > 0:
        raise ValueError(f"clip_range must be > 0, got {clip_range}")
    old = old_values.detach()
    clipped = old + torch.clamp(values - old, -clip_range, clip_range)
    return torch.maximum(err, (clipped - targets.detach()) ** 2).mean()


def kl_k3_tokens(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, *, check: bool = True
) -> Tensor:
    """``[B, L]`` per-token k3 estimate of KL(policy || reference), 0 off the mask.

    Per token ``exp(d) - d - 1`` with ``d = ref_logp - logp``: unbiased for the KL when tokens
    are sampled from the policy, and never negative (``e^d >= 1 + d``), unlike ``-d``.
    See http://joschu.net/blog/kl-approx.html. Tokens sampled at a temperature other than 1 are
    scored at that temperature (policy and reference alike), so the estimate is of the KL
    between the two tempered distributions.
    """
    check_float("logprobs", logprobs, dim=2)
    shape = tuple(logprobs.shape)
    check_float("ref_logprobs", ref_logprobs, shape=shape)
    valid = _bool_mask(mask, shape) if check or mask.dtype != torch.bool else mask
    if check:
        check_finite("logprobs", logprobs, valid)
        check_finite("ref_logprobs", ref_logprobs, valid)
    zeros = torch.zeros_like(logprobs)
    d = torch.where(valid, ref_logprobs.detach() - logprobs, zeros)
    return torch.where(valid, torch.exp(d) - d - 1.0, zeros)


def kl_k3(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """Per-sequence k3 KL estimate: :func:`kl_k3_tokens` summed over each row's real tokens.

    Returns:
        ``[B]``; 0 for a sequence whose tokens have equal log-probs (or no real token).
    """
    return kl_k3_tokens(logprobs, ref_logprobs, mask).sum(dim=1)
