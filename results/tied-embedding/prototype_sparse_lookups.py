"""Prototype (pair c): every nn.Embedding under gradient looks up with ``sparse=True``, then runs
the script it is given, as ``profile_calls.py``'s script:

    python benchmarks/profile_calls.py --timeline \\
        results/tied-embedding/prototype_sparse_lookups.py examples/length_ratio.py \\
        --epochs 1 --eval-repeats 1 --output-dir /tmp/run-sparse
"""

from __future__ import annotations

import runpy
import sys

import torch
from torch import Tensor, nn


def _sparse_forward(self: nn.Embedding, ids: Tensor) -> Tensor:
    sparse = self.sparse or (self.weight.requires_grad and torch.is_grad_enabled())
    return nn.functional.embedding(
        ids,
        self.weight,
        self.padding_idx,
        self.max_norm,
        self.norm_type,
        self.scale_grad_by_freq,
        sparse,
    )


if __name__ == "__main__":
    nn.Embedding.forward = _sparse_forward  # type: ignore[method-assign,assignment]
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
