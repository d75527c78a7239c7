"""A prototype, not library code: the completions' backward first, the shared prompt's second.

The prompt pass's outputs (its last logits and every layer's keys and values) are handed to the
completions' pass as detached leaves; after each ``Tensor.backward`` the prompt pass is backed
with those leaves' gradients, so each weight's two contributions meet in ``.grad`` instead of
being summed by autograd. Run (2026-12-06, beside the same job without it, one per core):

    OMP_NUM_THREADS=1 python benchmarks/profile_calls.py --timeline \\
        results/allocator/two_phase_backward.py examples/length_ratio.py --epochs 1 \\
        --eval-repeats 1 --output-dir /tmp/run-two-phase
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

import torch

from cmlrl_agents.policies import prefix_scoring

PENDING: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
original_forward = prefix_scoring._forward
original_backward = torch.Tensor.backward


def forward(model: Any, keep: int, names: Any, *, cache: Any, **inputs: Any) -> Any:
    fresh = cache.get_seq_length() == 0
    logits, cache = original_forward(model, keep, names, cache=cache, **inputs)
    if not (fresh and torch.is_grad_enabled() and logits.requires_grad):
        return logits, cache
    leaf = logits.detach().requires_grad_()
    outputs, leaves = [logits], [leaf]
    for layer in cache.layers:
        for attr in ("keys", "values"):
            tensor = getattr(layer, attr)
            detached = tensor.detach().requires_grad_()
            setattr(layer, attr, detached)
            outputs.append(tensor)
            leaves.append(detached)
    PENDING.append((outputs, leaves))
    return leaf, cache


def backward(self: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    original_backward(self, *args, **kwargs)
    while PENDING:
        outputs, leaves = PENDING.pop()
        pairs = [(o, x.grad) for o, x in zip(outputs, leaves, strict=True) if x.grad is not None]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])


if __name__ == "__main__":
    prefix_scoring._forward = forward  # type: ignore[assignment]
    torch.Tensor.backward = backward  # type: ignore[method-assign]
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
