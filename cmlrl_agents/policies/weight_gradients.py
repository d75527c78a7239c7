"""A weight used several times in one graph gathers its gradient in one buffer, in place.

Prefix-shared scoring (``prefix_scoring.py``) runs two forwards per batch, the distinct prompts
and then the completions on their cache, so every weight is used twice in one graph; a tied
embedding (SmolLM2's ``[49152, 576]`` weight is both the lookup and the output layer) is used
four times. Autograd computes each use's weight gradient into fresh memory and adds them out of
place: for each weight a product into a new buffer per use, then a new buffer per sum, and a
dense copy of the whole tied weight for each lookup's sparse rows. Every one of those buffers
is memory the process maps afresh, and on a virtual machine a page fault is dear
(``docs/benchmarks.md``, "On a virtual machine, page faults cost more").

Within :func:`gathered_weight_gradients`, each plain ``nn.Linear`` (and a tied ``nn.Embedding``)
whose weight is a trainable leaf computes its forward through an autograd function whose
backward hands the weight's gradient to a :class:`_Gradient` shared by every use of that weight
in the block. The first use to reach the backward computes its product into a new buffer and
returns it to autograd; the later uses add into that buffer in place (``addmm_``,
``index_add_``) and return nothing, before autograd accumulates the weight's gradient, which
waits for every use. A one-shot hook on the weight drops the block's reference to the buffer
just before that accumulation, so autograd takes the buffer as the gradient without copying it;
a callback at the end of the backward drops it too, so a backward that never reaches the weight
(an ``autograd.grad`` for other inputs) leaves the next one the weight's whole gradient.

What autograd computes is unchanged up to float rounding: the uses' products are summed in
another way (inside the product instead of after it). Input gradients are the same products as
autograd's. Left to autograd's own path: weights that are frozen or not leaves, modules with a
forward of their own (an ``accelerate`` hook, say), embeddings with ``max_norm``,
``scale_grad_by_freq`` or ``sparse``, passes under autocast (their backward mixes dtypes), and
transformers models with activation checkpointing on (its recomputation runs the layers' own
forwards; a model that calls ``torch.utils.checkpoint`` by itself is not detected).

One epoch of the main job, side by side with the code before it (one thread, one run per core,
two pairs; ``docs/benchmarks.md``, "One gradient buffer per weight"): backward passes 0.90x and
updates 0.89-0.95x of the CPU time, a quarter of the page faults gone, the same evaluations
digit for digit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd import Variable
from torch.nn import functional as F

from cmlrl_agents.policies.model_methods import base_model
from cmlrl_agents.policies.module_forwards import own_forward, replaced_forwards

__all__ = ["gathered_weight_gradients"]


class _Gradient:
    """One weight's gradient as its uses' backwards gather it, in one backward pass."""

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.buffer: Tensor | None = None

    def gather(self, fresh: Callable[[], Tensor], add: Callable[[Tensor], None]) -> Tensor | None:
        """The first use's ``fresh()`` product (handed to autograd), or None after adding a
        later use's part into it (``add(buffer)``, in place)."""
        if self.buffer is None:
            self.buffer = fresh()
            self._hook = self.weight.register_hook(self._release)
            # Also at the end of this backward, whether or not it reached the weight (an
            # ``autograd.grad`` for other inputs does not): the next backward starts afresh.
            Variable._execution_engine.queue_callback(self._release)
            return self.buffer
        add(self.buffer)
        return None

    def _release(self, grad: Tensor | None = None) -> None:
        # As a hook on the weight, runs just before autograd accumulates its gradient (every use
        # has added its part by then): with no other reference left, autograd takes the buffer,
        # not a copy.
        self.buffer = None
        self._hook.remove()


class _GatheredLinear(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, gradient: _Gradient
    ) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.gradient = gradient
        ctx.has_bias = bias is not None
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        inputs = x.reshape(-1, x.shape[-1])
        grad_x = rows.mm(weight).view(x.shape) if ctx.needs_input_grad[0] else None
        grad_weight = ctx.gradient.gather(
            lambda: rows.t().mm(inputs), lambda buffer: buffer.addmm_(rows.t(), inputs)
        )
        grad_bias = rows.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_weight, grad_bias, None


class _GatheredLookup(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, ids: Tensor, weight: Tensor, padding_idx: int | None, gradient: _Gradient
    ) -> Tensor:
        ctx.save_for_backward(ids)
        ctx.gradient = gradient
        ctx.padding_idx = padding_idx
        ctx.shape = weight.shape
        return F.embedding(ids, weight, padding_idx)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        (ids,) = ctx.saved_tensors
        index, rows = ids.reshape(-1), grad.reshape(-1, grad.shape[-1])
        if ctx.padding_idx is not None:  # the padding row gets no gradient, as in nn.Embedding
            keep = index != ctx.padding_idx
            index, rows = index[keep], rows[keep]

        def fresh() -> Tensor:
            return rows.new_zeros(ctx.shape).index_add_(0, index, rows)

        return None, ctx.gradient.gather(fresh, lambda b: b.index_add_(0, index, rows)), None, None


def _gathers(module: nn.Module) -> bool:
    """Whether ``module`` has a weight that is a trainable leaf (a parameter under training)."""
    weight = getattr(module, "weight", None)
    return isinstance(weight, Tensor) and weight.requires_grad and weight.is_leaf


def _linear_forward(module: nn.Linear, gradient: _Gradient) -> Callable[[Tensor], Tensor]:
    def forward(x: Tensor) -> Tensor:
        return _GatheredLinear.apply(x, module.weight, module.bias, gradient)

    return forward


def _lookup_forward(module: nn.Embedding, gradient: _Gradient) -> Callable[[Tensor], Tensor]:
    def forward(ids: Tensor) -> Tensor:
        return _GatheredLookup.apply(ids, module.weight, module.padding_idx, gradient)

    return forward


def _tied_lookup(module: nn.Embedding, linear_weights: set[int]) -> bool:
    """Whether ``module`` is a plain lookup whose weight a gathering ``nn.Linear`` also uses
    (an untied lookup alone would gain nothing: its first use is a dense zero-filled buffer,
    what autograd makes)."""
    return (
        type(module) is nn.Embedding
        and id(module.weight) in linear_weights
        and module.max_norm is None
        and not module.scale_grad_by_freq
        and not module.sparse
    )


def _checkpointing(model: nn.Module) -> bool:
    """Whether a transformers model recomputes its layers in the backward (activation, or
    gradient, checkpointing): non-reentrant recomputation runs the layers' own forwards and
    checks that they save what the first forward saved, which the gathering forwards do not."""
    base = base_model(model)
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):  # new name, old
        if hasattr(type(base), name):
            return bool(getattr(base, name))
    return False


@contextmanager
def gathered_weight_gradients(model: nn.Module) -> Iterator[None]:
    """Within the block, the trainable weights of ``model``'s plain ``nn.Linear`` layers, and
    of an ``nn.Embedding`` that shares its weight with one of them (a tied embedding), gather
    the gradients of all their uses in the block's forwards in one buffer each (see the module
    docstring). Changes nothing when gradients are off, autocast is on or the model checkpoints
    its activations; on leaving, every module is as it was."""
    devices = {p.device.type for p in model.parameters()}
    autocast = any(torch.is_autocast_enabled(d) for d in devices)
    if not torch.is_grad_enabled() or autocast or _checkpointing(model):
        yield
        return
    modules = [m for m in model.modules() if not own_forward(m) and _gathers(m)]
    linear = {id(m.weight) for m in modules if type(m) is nn.Linear}
    gradients: dict[int, _Gradient] = {}

    def gradient_of(weight: Tensor) -> _Gradient:
        if id(weight) not in gradients:
            gradients[id(weight)] = _Gradient(weight)
        return gradients[id(weight)]

    forwards: list[tuple[nn.Module, Callable[[Tensor], Tensor]]] = []
    for module in modules:
        if type(module) is nn.Linear:
            forwards.append((module, _linear_forward(module, gradient_of(module.weight))))
        elif isinstance(module, nn.Embedding) and _tied_lookup(module, linear):
            forwards.append((module, _lookup_forward(module, gradient_of(module.weight))))
    with replaced_forwards(forwards):
        yield
