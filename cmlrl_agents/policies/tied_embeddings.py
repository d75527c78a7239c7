"""The input side's gradient of a tied embedding as the rows it touches, not a dense matrix.

Most small causal LMs (SmolLM2 among them) tie the output layer to the input embedding: one
``[vocab, hidden]`` weight, whose gradient in a scoring pass comes from both ends. The output
layer's part is dense. The embedding lookup's touches only the rows of the batch's tokens, but
``nn.Embedding`` hands it back as a dense ``[vocab, hidden]`` tensor, zero-filled and then
scattered into: 113 MB for SmolLM2, once per forward (the shared prompt pass and the completions'
pass each), which autograd then adds to the rest. With ``sparse=True`` the lookup's gradient is
those rows alone, and autograd adds them into the output layer's dense gradient. The weight's
gradient stays dense, so the optimizer sees what it saw, up to float rounding (the terms are
summed in another order).

One epoch of the main job, side by side with the code without it (one thread, one run per core,
two pairs; ``docs/benchmarks.md``, "The tied embedding's gradient"): backward passes 0.96-0.97x
and rounds 0.98-0.99x of the CPU time, peak memory 70-100 MB lower, the same evaluations digit
for digit.

Only a tied, trainable weight under gradient is changed: an untied embedding's gradient would
reach the optimizer sparse, which AdamW refuses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from cmlrl_agents.policies.model_methods import input_embeddings, output_embeddings

__all__ = ["sparse_tied_gradient"]


def _tied_embedding(model: nn.Module) -> nn.Embedding | None:
    """``model``'s input embedding when it is a plain ``nn.Embedding`` whose trainable weight is
    also the output layer's weight; else None."""
    embedding, output = input_embeddings(model), output_embeddings(model)
    if type(embedding) is not nn.Embedding or output is None:
        return None
    weight = embedding.weight
    if not weight.requires_grad or getattr(output, "weight", None) is not weight:
        return None
    return embedding


@contextmanager
def sparse_tied_gradient(model: nn.Module) -> Iterator[None]:
    """Within the block (a forward whose loss goes through the output layer), a tied
    embedding's lookups give their gradient as the rows they touch (``sparse=True``). Changes
    nothing when gradients are off or the weight is untied, frozen or not a plain
    ``nn.Embedding``; on leaving, the embedding is as it was."""
    embedding = _tied_embedding(model) if torch.is_grad_enabled() else None
    if embedding is None or embedding.sparse:
        yield
        return
    embedding.sparse = True
    try:
        yield
    finally:
        embedding.sparse = False
