"""Advantages from returns: group baselines (MAGRPO family) and batch z-scoring (actor-critic).

Pure tensor functions: no model, no tokenizer, no state. Every function checks its inputs and
raises ``ValueError`` naming the argument, what it got and how to fix it, because a silently
broadcast or NaN advantage trains the policy on garbage without any visible error.
"""

from __future__ import annotations

import math

from torch import Tensor

from cmlrl_agents._checks import check_finite, check_float

__all__ = ["BASELINES", "group_advantages", "normalize_batch", "pooled_std"]

BASELINES: tuple[str, ...] = ("mean", "rloo", "max", "raw")
"""Baselines accepted by :func:`group_advantages`."""


def _check_group_inputs(
    returns: Tensor, baseline: str, normalize_std: bool, eps: float, std: float | None
) -> None:
    check_finite("returns", check_float("returns", returns))
    if returns.dim() != 2 or returns.shape[1] == 0:
        raise ValueError(
            f"returns must have shape [num_groups, G] with G >= 1, got shape "
            f"{tuple(returns.shape)}; for a single group use returns.unsqueeze(0)"
        )
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}; it keeps the std division finite")
    if baseline == "raw" and normalize_std:
        raise ValueError(
            "baseline 'raw' with normalize_std=True would divide returns that have no baseline "
            "by their std, so equal returns (std 0) become huge advantages; pass "
            "normalize_std=False or a baseline ('mean', 'rloo', 'max')"
        )
    if std is not None and not (math.isfinite(std) and std >= 0):
        raise ValueError(f"std must be a finite float >= 0, got {std}; None uses each row's own")
    if baseline == "rloo" and returns.shape[1] < 2:
        raise ValueError(
            f"baseline 'rloo' needs G >= 2 samples per group, got returns of shape "
            f"{tuple(returns.shape)}; sample more per state or use baseline 'mean'"
        )


def _baselined(returns: Tensor, baseline: str) -> Tensor:
    """Each row's returns less its siblings' baseline (``group_advantages`` says which)."""
    group_size = returns.shape[1]
    if baseline == "mean":
        return returns - returns.mean(dim=1, keepdim=True)
    if baseline == "rloo":
        total = returns.sum(dim=1, keepdim=True)
        return (group_size * returns - total) / (group_size - 1)
    if baseline == "max":
        return returns - returns.max(dim=1, keepdim=True).values
    return returns.clone()  # "raw"


def group_advantages(
    returns: Tensor,
    baseline: str,
    normalize_std: bool,
    eps: float = 1e-6,
    *,
    std: float | None = None,
) -> Tensor:
    """Per-group advantages for the group-relative REINFORCE family.

    Args:
        returns: ``[num_groups, G]``. Row ``k`` holds the returns of the ``G`` sibling joint
            actions sampled from one state; the baseline only ever uses a row's own siblings.
        baseline: ``"mean"``: ``A = R - mean(R)``; ``"rloo"`` (leave-one-out):
            ``A = (G*R - sum(R)) / (G - 1)``, needs ``G >= 2``; ``"max"``: ``A = R - max(R)``;
            ``"raw"``: ``A = R``.
        normalize_std: divide by ``std_pop(R) + eps`` (population std of the row's returns).
            The result is NOT re-centred, so the baselines stay distinct. Refused with "raw":
            without a baseline a row of equal returns (std 0) would be scaled by ``1/eps``.
        eps: added to the std; must be > 0. A row of equal returns has std 0 and advantages 0
            for "mean"/"rloo"/"max", so dividing by ``eps`` leaves them 0.
        std: with ``normalize_std``, divide every row by ``std + eps`` instead of by its own
            std: one figure for the whole batch (TRL's ``scale_rewards="batch"``, the std of
            every return of the round, e.g. from :func:`pooled_std`). None: each row's own.

    Returns:
        ``[num_groups, G]`` advantages, same dtype and device as ``returns``.

    Raises:
        ValueError: ``returns`` not a finite 2-D float tensor, unknown ``baseline``,
            ``G < 2`` with ``"rloo"``, ``"raw"`` with ``normalize_std``, or ``eps <= 0``.
    """
    _check_group_inputs(returns, baseline, normalize_std, eps, std)
    adv = _baselined(returns, baseline)
    if normalize_std:
        # Scale only. The reference subtracted mean(A) here as well, which maps every baseline
        # to (R - mean R) / std R and made MAGRPO/MARLOO/MAReMax/MAREINFORCE identical (bug B7).
        if std is None:
            adv = adv / (returns.std(dim=1, unbiased=False, keepdim=True) + eps)
        else:
            adv = adv / (std + eps)
    return adv


def pooled_std(count: float, total: float, total_sq: float) -> float:
    """The population std of values known only by their ``count``, sum (``total``) and sum of
    squares (``total_sq``).

    The three add up over batches and processes, so one all-reduce of them gives the std of a
    whole round split across ranks, equal to the one-process figure to float rounding. Pass them
    in float64: ``total_sq / count - mean**2`` cancels digits when the mean dwarfs the spread.
    """
    if not count > 0:
        raise ValueError(f"count must be > 0, got {count}; there is no std of no values")
    mean = total / count
    # Rounding can leave a tiny negative variance for equal values; their std is 0.
    return math.sqrt(max(total_sq / count - mean * mean, 0.0))


def normalize_batch(adv: Tensor, eps: float = 1e-8) -> Tensor:
    """Z-score advantages over a whole batch (actor-critic advantage normalisation).

    ``(adv - mean(adv)) / (std_pop(adv) + eps)`` over all elements, any shape. The population
    std (not the unbiased one) is used so that a batch of ONE element gives ``adv - mean = 0``
    instead of NaN (unbiased std of one value is 0/0). A batch of equal values also gives zeros.

    Args:
        adv: advantages, any shape with at least one element.
        eps: added to the std; must be > 0.

    Returns:
        Tensor with the shape, dtype and device of ``adv``.
    """
    check_finite("adv", check_float("adv", adv))
    if adv.numel() == 0:
        raise ValueError(f"adv is empty (shape {tuple(adv.shape)}); there is nothing to normalise")
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}; it keeps the std division finite")
    centred = adv - adv.mean()
    return centred / (adv.std(unbiased=False) + eps)
