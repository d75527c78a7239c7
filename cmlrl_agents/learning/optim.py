"""Optimizers for agents, critics and reward models: one AdamW recipe, shared (the step itself
is the engine's: learning/engine.py)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

__all__ = ["agent_optimizers", "make_adamw"]


def make_adamw(
    params: Iterable[torch.nn.Parameter] | list[dict[str, Any]],
    lr: float,
    name: str,
    weight_decay: float = 0.0,
) -> torch.optim.Optimizer:
    """AdamW over ``params`` (tensors or param groups) with ``weight_decay`` (the config's: 0 by
    default, as in Hugging Face's Trainer; torch's own default of 0.01 is not used, so no decay
    applies that no setting names); ``name`` appears in errors.

    The fused kernel when every parameter is a float on CPU or CUDA: on 2 CPU cores it steps
    SmolLM2-135M in 0.18 s against 1.5 s for ``foreach`` (and 0.5 s against 8.4 s on the first
    step), and allocates no full-size temporaries, so peak memory stays lower too.
    """
    given: list[Any] = list(params)  # tensors or param groups
    groups: list[dict[str, Any]] = given
    if given and not isinstance(given[0], dict):
        groups = [{"params": given}]
    tensors = [p for group in groups for p in group["params"]]
    if not tensors:
        raise ValueError(
            f"{name} has no trainable parameters (requires_grad=False everywhere); unfreeze "
            "some, or wrap it with a LoRA adapter."
        )
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in tensors)
    return torch.optim.AdamW(groups, lr=lr, weight_decay=weight_decay, fused=fused or None)


def agent_optimizers(
    agents: Sequence[Any], lr: float, weight_decay: float
) -> list[torch.optim.Optimizer]:
    """One AdamW per agent over its trainable parameters (an adapter agent's: its adapter)."""
    return [
        make_adamw(agent.trainable_parameters(), lr, f"agents[{i}]", weight_decay)
        for i, agent in enumerate(agents)
    ]
