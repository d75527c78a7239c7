"""Decoding steps on a CPU with each linear layer's weight laid out ``[in, out]`` for the call.

``nn.Linear`` stores its weight ``[out, in]`` and multiplies ``x @ W.T``. A decoding step
multiplies a few rows (one per sequence) by every weight of the model, and for a few rows
MKL's CPU kernel for that transposed operand can be slow: on a machine whose torch ran its
AVX-512 kernels (MKL, one thread) a SmolLM2 MLP weight ``[1536, 576]`` times 8 rows took 383 µs
through ``nn.Linear`` and 156 µs as ``x @ W_t`` with ``W_t`` contiguous ``[576, 1536]``, the
output layer 36.8 against 19.1 ms. :func:`decode_layout` copies each weight into that layout
once per ``generate`` call and multiplies the few-row steps with the copy; passes of more rows
(the prompt pass) keep ``nn.Linear``'s own path, which is as fast or faster there.

A whole decoding step of SmolLM2-135M for 8 rows fell from 145 to 122 CPU ms on one thread,
the copies' making included, and 16 and 32 rows barely moved; on two threads 8, 16 and 32 rows
took 0.74, 0.60 and 0.75 of the CPU time (``benchmarks/decode_layout.py``;
``docs/benchmarks.md``, "Decoding with transposed weights"). The products differ by float
rounding only (another summation order), which can flip a draw that sits at a boundary. The
cost is memory: one more copy of the linear weights while the model generates (about 0.54 GB
for SmolLM2-135M), none while it trains.

That gain is a property of the kernels, not of the layout: on an AMD EPYC (Zen 3) whose torch
runs its AVX2 kernels (MKL, one thread) the same step took 118 ms without the copies and 135
with them, the output layer's product 1.3 times as long. So the copies are made only where
torch runs its AVX-512 kernels (:func:`copies_pay_off`), the only kind they were measured to
speed up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from typing import TypeGuard

import torch
from torch import Tensor, nn

__all__ = ["DECODE_ROWS", "copies_pay_off", "decode_layout"]

DECODE_ROWS = 32
"""Passes of at most this many rows (tokens over the whole batch) use the ``[in, out]`` copy:
the decoding steps of up to 32 sequences. Above it (a prompt pass) ``nn.Linear``'s own kernel
holds its own: at 64 rows the copy was faster for the MLP weights and slower for the output
layer, at 128 rows ``nn.Linear`` was as fast or faster for all three (one thread)."""


def copies_pay_off() -> bool:
    """Whether torch runs its AVX-512 CPU kernels here, where the copies were measured to make a
    decoding step faster; with its AVX2 kernels they made it slower (module docstring)."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def _few_rows_forward(layer: nn.Linear, weight_t: Tensor, x: Tensor) -> Tensor:
    if x.numel() // x.shape[-1] > DECODE_ROWS:
        return nn.functional.linear(x, layer.weight, layer.bias)
    y = x @ weight_t
    return y if layer.bias is None else y + layer.bias


def _eligible(module: nn.Module) -> TypeGuard[nn.Linear]:
    # Exactly nn.Linear (a quantised or otherwise special subclass computes something else),
    # float32 on a CPU (where it was measured), and a forward nobody has replaced (accelerate's
    # hooks set an instance forward that this must neither wrap nor remove).
    return (
        type(module) is nn.Linear
        and module.weight.device.type == "cpu"
        and module.weight.dtype == torch.float32
        and "forward" not in vars(module)
    )


@contextmanager
def decode_layout(model: nn.Module, sequences: int) -> Iterator[None]:
    """Within the block, every eligible ``nn.Linear`` of ``model`` multiplies passes of at most
    :data:`DECODE_ROWS` rows by an ``[in, out]`` copy of its weight taken on entry. For
    inference only: the copy does not follow later changes of the weight, and it has no
    gradient. On leaving, the layers are as they were. ``sequences``: the rows of each decoding
    step; above :data:`DECODE_ROWS` no step would use the copies, so none are made. Where
    :func:`copies_pay_off` says no, the block changes nothing."""
    patched: list[nn.Linear] = []
    wanted = sequences <= DECODE_ROWS and copies_pay_off()
    try:
        for module in model.modules() if wanted else ():
            if _eligible(module):
                weight_t = module.weight.detach().t().contiguous()
                module.forward = partial(_few_rows_forward, module, weight_t)  # type: ignore[method-assign]
                patched.append(module)
        yield
    finally:
        for module in patched:
            del module.forward
