"""Mixed-adapter decoding with each adapter's rows taken as one slice.

peft runs a batch whose rows use different adapters (``adapter_names``, one per row) by
gathering each adapter's rows in every LoRA layer at every step: it lists the rows of each name
anew, copies them out with an index, and adds the adapter's product back with an indexed
write. The rows of a team's ``generate`` call come agent by agent, so each adapter's rows
are one run of the batch, and a slice of the input is the same rows without a copy.
:func:`adapter_span_forwards` replaces the forward of peft's LoRA layers so that a mixed batch
adds each run's product into its slice of the base layer's output in place: the same operations
on the same numbers, so the tokens are the same.

One ``generate`` call of 32 tokens for 16 rows (two SmolLM2-135M-Instruct adapters of rank 16
on the attention's projections, 8 rows each; one thread, an AMD EPYC with torch's AVX-512
kernels) took 4.98 CPU s instead of peft's 5.69, where the base alone took 4.27
(``benchmarks/adapter_spans.py``; ``docs/benchmarks.md``, "Adapter rows as slices").
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from torch import Tensor, nn
from torch.nn.functional import linear

from cmlrl_agents.policies.module_forwards import own_forward, replaced_forwards

__all__ = ["AdapterSpan", "adapter_span_forwards", "adapter_spans"]

AdapterSpan = tuple[str, int, int]
"""``(adapter, start, stop)``: rows ``start:stop`` of a batch run under ``adapter``."""


def adapter_spans(adapter_names: Sequence[str]) -> list[AdapterSpan]:
    """The runs of equal names in ``adapter_names``, in order: ``["a", "a", "b"]`` gives
    ``[("a", 0, 2), ("b", 2, 3)]``; a name that comes back starts a run of its own."""
    spans: list[AdapterSpan] = []
    start = 0
    for row in range(1, len(adapter_names) + 1):
        if row == len(adapter_names) or adapter_names[row] != adapter_names[start]:
            spans.append((adapter_names[start], start, row))
            start = row
    return spans


class _Spans:
    """The spans of the last ``adapter_names`` list seen: peft hands every layer of one
    forward the same list object, so a step works them out once, not once per layer."""

    def __init__(self) -> None:
        self.names: list[str] | None = None
        self.spans: list[AdapterSpan] = []

    def of(self, names: list[str]) -> list[AdapterSpan]:
        if names is not self.names:
            self.names, self.spans = names, adapter_spans(names)
        return self.spans


def _variant_among(layer: Any, names: list[str]) -> bool:
    """Whether a row's adapter is DoRA or another LoRA variant, which compute otherwise
    (``lora_variant`` is peft's since 0.16; ``use_dora`` before and since)."""
    variants = getattr(layer, "lora_variant", None) or {}
    dora = {name for name, on in layer.use_dora.items() if on}
    return bool(variants or dora) and any(n in variants or n in dora for n in set(names))


def _span_forward(layer: Any, spans: _Spans, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    """peft's ``lora.Linear.forward`` for a mixed batch of plain LoRA adapters, each run of
    rows as a slice; anything else goes to peft's own forward, which also raises its errors."""
    names = kwargs.get("adapter_names")
    if (
        names is None
        or args
        or len(kwargs) != 1
        or not isinstance(names, list)
        or len(names) != x.shape[0]
        or layer.merged
        or layer.disable_adapters
        or _variant_among(layer, names)
    ):
        return type(layer).forward(layer, x, *args, **kwargs)
    result: Tensor = layer.base_layer(x)
    for name, start, stop in spans.of(names):
        if name not in layer.lora_A:  # "__base__", or an adapter this layer does not have
            continue
        lora_a, lora_b = layer.lora_A[name], layer.lora_B[name]
        dropout = layer.lora_dropout[name]
        if (
            type(lora_a) is not nn.Linear
            or type(lora_b) is not nn.Linear
            or x.dtype != lora_a.weight.dtype
            or result.dtype != x.dtype
            or (dropout.training and not isinstance(dropout, nn.Identity))
        ):
            # peft casts the rows and the product, and drops out while training: not done here
            return type(layer).forward(layer, x, *args, **kwargs)
        # nn.Linear's own call, without the module call around it (the adapters' products are
        # small enough for that to be most of their time).
        product = linear(
            linear(x[start:stop], lora_a.weight, lora_a.bias), lora_b.weight, lora_b.bias
        )
        result[start:stop] += product.mul_(layer.scaling[name])
    return result


def _lora_layers(model: nn.Module) -> Iterator[nn.Module]:
    """peft's LoRA ``Linear`` layers of ``model`` (exactly that class: its subclasses, the
    quantised layers, compute otherwise) whose forward nobody has replaced."""
    peft_lora = sys.modules.get("peft.tuners.lora.layer")
    if peft_lora is None:
        return
    for module in model.modules():
        if type(module) is peft_lora.Linear and not own_forward(module):
            yield module


@contextmanager
def adapter_span_forwards(model: nn.Module, adapter_names: Sequence[str] | None) -> Iterator[None]:
    """Within the block, mixed-adapter passes of ``model``'s LoRA layers add each run of rows
    with one adapter as a slice (the module docstring); for inference, where peft's indexed
    write and the slice's in-place add are one and the same. ``adapter_names``: the batch's
    names, one per row; None (no mixed batch) changes nothing, so an agent generating alone
    keeps peft's own forward without a wrapper around it. On leaving, the layers are as they
    were."""
    layers = () if adapter_names is None else _lora_layers(model)
    spans = _Spans()
    with replaced_forwards((layer, partial(_span_forward, layer, spans)) for layer in layers):
        yield
