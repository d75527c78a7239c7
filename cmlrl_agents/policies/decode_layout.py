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
torch runs its AVX-512 kernels, the only kind they were measured to speed up (but see AMD's
below).

With the AVX2 kernels it is the output layer that runs slowly at few rows: MKL multiplied 8 rows
by SmolLM2's ``[49152, 576]`` weight at about 4.5 GB/s of weight read, where a sum reads this
CPU's memory at about 16. There :func:`decode_layout` instead hands that one layer's weight to
oneDNN, packed once per ``generate`` call into its own blocked layout (0.12 s for SmolLM2), and
multiplies the few-row steps with oneDNN's kernel: the product took 0.52-0.65 of MKL's time at
4-32 rows, a whole decoding step of 8 rows about 0.9 (the packing included). Packing the other
layers too gained nothing more: their weights come from memory at every step either way, and
packing them all took 0.7 s a call (``docs/benchmarks.md``, "The output layer packed for
oneDNN, on AVX2").

On an AMD EPYC whose torch runs its AVX-512 kernels (Zen 4) neither holds: there the copies made
a decoding step of 8 rows slower (1.09 times as long as without) and MKL's products ran as on
Zen 3, while oneDNN's AVX-512 kernels multiplied each weight in 0.35-0.62 of MKL's time at 4-8
rows. So on AMD CPUs with AVX-512 kernels every eligible layer is packed for oneDNN (0.22 s for
SmolLM2 per call): a decoding step of 8 rows took 0.75 of the time without, 0.68 of the copies'
(``docs/benchmarks.md``, "Every layer packed for oneDNN, on AMD's AVX-512").
:func:`decode_weights` makes the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache, partial
from typing import Literal, TypeGuard

import torch
from torch import Tensor, nn

from cmlrl_agents.policies.model_methods import output_embeddings
from cmlrl_agents.policies.module_forwards import own_forward, replaced_forwards

__all__ = [
    "DECODE_ROWS",
    "DecodeWeights",
    "cpu_vendor",
    "decode_layout",
    "decode_weights",
    "onednn_linear",
]

DECODE_ROWS = 32
"""Passes of at most this many rows (tokens over the whole batch) use the ``[in, out]`` copy:
the decoding steps of up to 32 sequences. Above it (a prompt pass) ``nn.Linear``'s own kernel
holds its own: at 64 rows the copy was faster for the MLP weights and slower for the output
layer, at 128 rows ``nn.Linear`` was as fast or faster for all three (one thread)."""


DecodeWeights = Literal["as_is", "copies", "packed", "packed_output"]
"""What the few-row products multiply by: ``nn.Linear``'s own weight ("as_is"), an ``[in, out]``
copy of every eligible layer's weight ("copies"), every eligible layer's weight packed for
oneDNN ("packed"), or the output layer's alone ("packed_output")."""


@cache
def cpu_vendor() -> str:
    """The CPU's vendor id as Linux reports it ("GenuineIntel", "AuthenticAMD"); "" where
    ``/proc/cpuinfo`` says none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def onednn_linear() -> bool:
    """Whether this torch has oneDNN and its linear on a packed weight (an op whose name is
    private, so it is looked up)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def decode_weights() -> DecodeWeights:
    """The weights this CPU's decoding steps multiply by, as measured on each kind of CPU
    (module docstring): where torch runs its AVX-512 kernels, every layer packed for oneDNN on
    an AMD CPU (Zen 4) and the copies elsewhere (measured on a machine whose vendor was not
    recorded); with its AVX2 kernels, the output layer packed for oneDNN (AMD Zen 3). Without
    oneDNN, and on the kernels none was measured on (ARM's, plain x86), ``nn.Linear``'s own."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return "packed" if cpu_vendor() == "AuthenticAMD" and onednn_linear() else "copies"
    if capability == "AVX2" and onednn_linear():
        return "packed_output"
    return "as_is"


def _few_rows_forward(
    product: Callable[[nn.Linear, Tensor, Tensor], Tensor],
    layer: nn.Linear,
    prepared: Tensor,
    x: Tensor,
) -> Tensor:
    """``product(layer, prepared, x)`` for a pass of at most :data:`DECODE_ROWS` rows,
    ``nn.Linear``'s own product above."""
    if x.numel() // x.shape[-1] > DECODE_ROWS:
        return nn.functional.linear(x, layer.weight, layer.bias)
    return product(layer, prepared, x)


def _copy_product(layer: nn.Linear, weight_t: Tensor, x: Tensor) -> Tensor:
    y = x @ weight_t
    return y if layer.bias is None else y + layer.bias


def _copied(layer: nn.Linear) -> Callable[[Tensor], Tensor]:
    weight_t = layer.weight.detach().t().contiguous()
    return partial(_few_rows_forward, _copy_product, layer, weight_t)


def _packed_product(layer: nn.Linear, packed: Tensor, x: Tensor) -> Tensor:
    # oneDNN's linear on a weight packed by _reorder_linear_weight: the op torch's own compiler
    # emits for a frozen linear layer on a CPU (its name is private: onednn_linear looks it up).
    y: Tensor = torch.ops.mkldnn._linear_pointwise(x, packed, layer.bias, "none", [], "")
    return y


def _packed(layer: nn.Linear) -> Callable[[Tensor], Tensor]:
    # The batch size is a hint for oneDNN's layout: packed for 8 rows, 1 to 64 rows ran as fast
    # as with a packing for their own count.
    packed = torch.ops.mkldnn._reorder_linear_weight(layer.weight.detach(), 8)
    return partial(_few_rows_forward, _packed_product, layer, packed)


def _decoding_forwards(model: nn.Module) -> Iterator[tuple[nn.Linear, Callable[[Tensor], Tensor]]]:
    """Each layer to change for decoding here, with the forward it decodes with."""
    weights = decode_weights()
    if weights in ("copies", "packed"):
        prepare = _copied if weights == "copies" else _packed
        for module in model.modules():
            if _eligible(module):
                yield module, prepare(module)
    elif weights == "packed_output":
        output = output_embeddings(model)
        if output is not None and _eligible(output):
            yield output, _packed(output)


def _eligible(module: nn.Module) -> TypeGuard[nn.Linear]:
    # Exactly nn.Linear (a quantised or otherwise special subclass computes something else),
    # float32 on a CPU (where it was measured), and a forward nobody has replaced (accelerate's
    # hooks set an instance forward that this must neither wrap nor remove).
    return (
        type(module) is nn.Linear
        and module.weight.device.type == "cpu"
        and module.weight.dtype == torch.float32
        and not own_forward(module)
    )


@contextmanager
def decode_layout(model: nn.Module, sequences: int) -> Iterator[None]:
    """Within the block, the few-row passes (at most :data:`DECODE_ROWS` rows) of ``model``'s
    layers run on weights prepared on entry for this CPU's kernels (:func:`decode_weights`):
    every eligible ``nn.Linear`` multiplies by an ``[in, out]`` copy of its weight ("copies") or
    by its weight packed for oneDNN ("packed"), or only the output layer
    (``get_output_embeddings()``) by its packed weight ("packed_output"); "as_is" changes
    nothing. For inference only: the prepared weights do not follow later changes of the
    weight, and they have no gradient. On leaving, the layers are as they were. ``sequences``:
    the rows of each decoding step; above :data:`DECODE_ROWS` no step would use the prepared
    weights, so none are made."""
    with replaced_forwards(_decoding_forwards(model) if sequences <= DECODE_ROWS else ()):
        yield
