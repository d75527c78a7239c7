"""Prototype: the tied embedding's input-side gradient as a sparse tensor (no [V, H] zero fill)."""
import runpy, sys
import torch
from torch import nn

def forward(self, input):
    sparse = self.weight.requires_grad and torch.is_grad_enabled()
    return nn.functional.embedding(input, self.weight, self.padding_idx, self.max_norm,
                                   self.norm_type, self.scale_grad_by_freq, sparse or self.sparse)

nn.Embedding.forward = forward
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
