"""Input checks shared by the pure tensor math (advantages, returns, losses) and the trainers.

A silently broadcast or NaN tensor trains the policy on garbage without a visible error, so every
public math function checks its inputs and names the argument, what it got and the fix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

__all__ = ["check_eval_dataset", "check_float", "check_finite", "finite_metrics"]


def check_float(
    name: str, x: object, *, shape: tuple[int, ...] | None = None, dim: int | None = None
) -> Tensor:
    """``x`` as a floating-point tensor of the given rank/shape, or a ValueError naming it."""
    if not isinstance(x, Tensor):
        raise ValueError(
            f"{name} must be a torch.Tensor, got {type(x).__name__}; wrap it with torch.as_tensor"
        )
    if not x.is_floating_point():
        raise ValueError(
            f"{name} must be a floating-point tensor, got dtype {x.dtype}; cast it with .float()"
        )
    if dim is not None and x.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(x.shape)}")
    if shape is not None and tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")
    return x


def check_finite(name: str, x: Tensor, valid: Tensor | None = None) -> None:
    """Raise if ``x`` holds NaN or inf where ``valid`` (default: everywhere).

    Padding after an episode's or a completion's end may hold anything; only real entries count.
    """
    bad = ~torch.isfinite(x.detach())
    if valid is not None:
        bad &= valid
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise ValueError(
            f"{name} contains NaN or inf at index {where}; fix it upstream (model outputs, "
            "rewards) instead of training on it"
        )


def finite_metrics(out: object, name: str) -> dict[str, float]:
    """A user callback's metrics as ``{str: finite float}``, or an error naming the callback:
    a NaN would otherwise land in the metric files as a bare ``NaN`` token (invalid JSON)."""
    if not isinstance(out, Mapping):
        raise TypeError(f"{name} must return a dict of str -> number, got {type(out).__name__}.")
    metrics = {}
    for key, value in out.items():
        try:
            if isinstance(value, (str, bytes)):
                raise TypeError
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise TypeError(
                f"{name} returned {key!r}: {value!r:.80}, which is not a number; return a dict "
                "of str -> float."
            ) from None
        if not math.isfinite(number):
            raise ValueError(
                f"{name} returned {key!r}: {number}; metrics must be finite (guard empty "
                "inputs, e.g. return {} when there is nothing to average)."
            )
        metrics[str(key)] = number
    return metrics


def check_eval_dataset(data: Any) -> None:
    """An empty eval split would evaluate nothing and log empty rows; refuse it up front."""
    if data is None:
        return
    from datasets import IterableDataset  # here: the tensor math importing this module needs none

    if isinstance(data, IterableDataset):
        empty = next(iter(data), None) is None  # one item read: it has no length
    else:
        empty = len(data) == 0
    if empty:
        raise ValueError(
            "eval_dataset is empty, so evaluation would score no item; pass eval items (e.g. "
            "the test part of train_test_split) or eval_dataset=None."
        )
