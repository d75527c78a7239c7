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
``scale_grad_by_freq`` or ``sparse`` or of a subclass (Gemma's scaled embedding), any weight
that such a module also holds (a gradient from outside the buffer makes autograd sum out of
place, and the uses that add in place after that sum would be lost), passes under autocast
(their backward mixes dtypes), and transformers models with activation checkpointing on (its
recomputation runs the layers' own forwards; a model that calls ``torch.utils.checkpoint`` by
itself is not detected). Two blocks in one backward (two scoring calls in one loss) share each
weight's buffer. A use of a gathered weight outside every block in the same backward (the
model called directly) is refused with an error when autograd accumulates the weight, as the
buffer's later parts may be lost there.

One epoch of the main job, side by side with the code before it (one thread, one run per core,
two pairs; ``docs/benchmarks.md``, "One gradient buffer per weight"): backward passes 0.90x and
updates 0.89-0.95x of the CPU time, a quarter of the page faults gone, the same evaluations
digit for digit.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd import Variable
from torch.nn import functional as F
from torch.utils.hooks import RemovableHandle

from cmlrl_agents.policies.model_methods import base_model
from cmlrl_agents.policies.module_forwards import own_forward, replaced_forwards

__all__ = ["gathered_weight_gradients"]


class _Gradient:
    """One weight's gradient as its uses' backwards gather it, in one backward pass.

    There is one per weight for as long as a block or a graph holds it (:data:`_GRADIENTS`), so
    two blocks whose graphs meet in one backward (two scoring calls in one loss) gather into one
    buffer: two buffers for one weight would be summed by autograd out of place, and the uses
    that add in place after that sum would be lost."""

    def __init__(self, weight: Tensor) -> None:
        self.weight = weight
        self.buffer: Tensor | None = None
        self.task = -1
        """The backward (autograd's graph task) the buffer belongs to."""
        self._hook: RemovableHandle | None = None

    def gather(self, fresh: Callable[[], Tensor], add: Callable[[Tensor], None]) -> Tensor | None:
        """The first use's ``fresh()`` product (handed to autograd), or None after adding a
        later use's part into it (``add(buffer)``, in place)."""
        if not self.weight.requires_grad:  # frozen since the forward: autograd skips it too
            return None
        task = torch._C._current_graph_task_id()
        if self.buffer is not None and self.task == task:
            add(self.buffer)
            return None
        self._drop()  # a buffer a backward stopped by an error left behind
        self.buffer, self.task = fresh(), task
        self._hook = self.weight.register_hook(self._check)
        # Also at the end of this backward, whether or not it reached the weight (an
        # ``autograd.grad`` for other inputs does not): the next backward starts afresh.
        Variable._execution_engine.queue_callback(self._drop)
        return self.buffer

    def _check(self, grad: Tensor) -> None:
        # A hook on the weight, run just before autograd accumulates its gradient (every use
        # has added its part by then). Dropping the reference first lets autograd take the
        # buffer, not a copy. If autograd holds another tensor, a use outside the gathering
        # modules sent the weight a gradient too, and autograd summed it with the buffer out of
        # place, before or after the uses that added in place: their parts may be missing. A
        # hook registered before this one may also have replaced the gradient, so the check
        # runs only where this hook is the weight's one.
        handed, ours = self.buffer, self.task == torch._C._current_graph_task_id()
        self._drop()
        if ours and grad is not handed and len(self.weight._backward_hooks or {}) == 0:
            for other in list(_GRADIENTS.values()):  # the backward stops here: no callback
                if other.task == self.task:
                    other._drop()
            raise RuntimeError(
                f"A weight of shape {list(self.weight.shape)} got part of its gradient in this "
                "backward from outside LLMAgent's scoring calls (the model called directly, or "
                "the weight used in the loss), which the scoring calls' gathered weight "
                "gradients cannot add to. Compute every use of the model in one backward "
                "through LLMAgent.score / score_tokens, or backward the other use separately."
            )

    def _drop(self) -> None:
        self.buffer = None
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


_GRADIENTS: weakref.WeakValueDictionary[int, _Gradient] = weakref.WeakValueDictionary()
"""Each weight's :class:`_Gradient` by ``id``, while a block or a graph (a use's saved
context) holds it; a record holds its weight, so the ``id`` is not reused meanwhile."""


def _gradient_of(weight: Tensor) -> _Gradient:
    gradient = _GRADIENTS.get(id(weight))
    if gradient is None:
        gradient = _GRADIENTS[id(weight)] = _Gradient(weight)
    return gradient


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
    forwards: list[tuple[nn.Module, Callable[[Tensor], Tensor]]] = []
    for module in modules:
        if type(module) is nn.Linear:
            forwards.append((module, _linear_forward(module, _gradient_of(module.weight))))
        elif isinstance(module, nn.Embedding) and _tied_lookup(module, linear):
            forwards.append((module, _lookup_forward(module, _gradient_of(module.weight))))
    # A weight that a module left to autograd also holds (Gemma's scaled embedding, tied to
    # its output layer; a module with a forward of its own) would get a gradient that autograd
    # sums with the buffer out of place: such weights stay on autograd's path everywhere.
    gathering = {id(module) for module, _ in forwards}
    elsewhere = {
        id(p)
        for m in model.modules()
        if id(m) not in gathering
        for p in m.parameters(recurse=False)
    }
    forwards = [(m, f) for m, f in forwards if id(m.weight) not in elsewhere]
    with replaced_forwards(forwards):
        yield
