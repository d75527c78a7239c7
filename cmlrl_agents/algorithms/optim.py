"""Optimizers for agents and critics: one AdamW recipe and one clipped step, shared."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["make_adamw", "clip_and_step"]


def make_adamw(
    params: Iterable[torch.nn.Parameter] | list[dict[str, Any]], lr: float, name: str
) -> torch.optim.Optimizer:
    """AdamW over ``params`` (tensors or param groups); ``name`` appears in errors.

    The fused kernel when every parameter is a float on CPU or CUDA: on 2 CPU cores it steps
    SmolLM2-135M in 0.18 s against 1.5 s for ``foreach`` (and 0.5 s against 8.4 s on the first
    step), and allocates no full-size temporaries, so peak memory stays lower too.
    """
    groups = list(params)
    if groups and not isinstance(groups[0], dict):
        groups = [{"params": groups}]
    tensors = [p for group in groups for p in group["params"]]
    if not tensors:
        raise ValueError(
            f"{name} has no trainable parameters (requires_grad=False everywhere); unfreeze "
            "some, or wrap it with a LoRA adapter."
        )
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in tensors)
    return torch.optim.AdamW(groups, lr=lr, fused=fused or None)


def clip_and_step(optimizer: torch.optim.Optimizer, max_norm: float | None) -> float:
    """Clip the gradient norm (None: measure only), step, and free the gradients.

    A non-finite norm raises instead of skipping the update silently (the reference replaced NaN
    losses by a constant, bug B9). Freeing the gradients right away keeps one agent's gradients
    out of memory while the next agent trains.
    """
    params = [p for group in optimizer.param_groups for p in group["params"]]
    limit = max_norm if max_norm is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, limit, error_if_nonfinite=True)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)
