"""A KV cache for sampling that writes each decoding step into room taken ahead.

transformers' ``DynamicLayer`` appends a step's keys and values with ``torch.cat``, which
copies the layer's whole cache at every decoding step, so the copying grows with the square of
the length: in a round of the main job (prompts of about 47 tokens, 48 new ones, 8 rows per
agent, one thread) the concatenations took 1.05 of 24.0 CPU seconds
(``benchmarks/profile_calls.py --ops-of-round 2``). :class:`GrowingLayer` keeps each layer's
keys and values in a buffer with room to spare, doubled when full: a step writes only its own
keys and values, and the cache is copied a logarithmic number of times. What it returns are
views of the buffer up to the cached length, equal to ``DynamicLayer``'s to the bit, so the
tokens sampled are the same.

For sampling only: the writes go in place, which the scoring passes' autograd through their
cache must not see; they keep ``DynamicCache``.

Both hold attention keys and values only. Models whose cache also holds other states (LFM2's
convolutions, Mamba's and Qwen3-Next's recurrent states) keep the caches transformers makes
for them, and the prompt is not shared (:func:`attention_cache`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import (
    Cache,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
)

__all__ = ["GrowingCache", "GrowingLayer", "attention_cache", "sampling_cache"]

MIN_ROOM = 64
"""Positions a layer's first buffer holds at least."""


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` whose keys and values are views of buffers with room for more.

    Methods inherited from ``DynamicLayer`` that replace the keys (``batch_select_indices``,
    ``reorder_cache``, ``batch_repeat_interleave``) leave tensors that are not views of the
    buffers; the next :meth:`update` sees that and starts new buffers from them."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._key_room: torch.Tensor | None = None
        self._value_room: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        end = length + key_states.shape[-2]
        if not self._fits(key_states, end):
            self._make_room(key_states, value_states, length, max(2 * end, MIN_ROOM))
        assert self._key_room is not None and self._value_room is not None
        self._key_room[..., length:end, :].copy_(key_states)
        self._value_room[..., length:end, :].copy_(value_states)
        self.keys = self._key_room[..., :end, :]
        self.values = self._value_room[..., :end, :]
        return self.keys, self.values

    def _fits(self, key_states: torch.Tensor, end: int) -> bool:
        """Whether the buffers hold the cached keys (as views) and have room up to ``end``."""
        room, keys = self._key_room, self.keys
        return (
            room is not None
            and keys is not None
            and keys.numel() > 0
            and keys.data_ptr() == room.data_ptr()
            and keys.stride() == room.stride()
            and room.shape[:-2] == key_states.shape[:-2]
            and end <= room.shape[-2]
        )

    def _make_room(
        self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, size: int
    ) -> None:
        """New buffers of ``size`` positions, holding the ``length`` cached ones."""
        shape = (*key_states.shape[:-2], size, key_states.shape[-1])
        key_room = key_states.new_empty(shape)
        value_room = value_states.new_empty((*shape[:-1], value_states.shape[-1]))
        if length:
            assert self.keys is not None and self.values is not None
            key_room[..., :length, :].copy_(self.keys)
            value_room[..., :length, :].copy_(self.values)
        self._key_room, self._value_room = key_room, value_room


class GrowingCache(DynamicCache):
    """``DynamicCache`` of :class:`GrowingLayer` layers (one per decoder layer, made as used)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)


_FITS_TRANSFORMERS = (
    "layer_class_to_replicate" in inspect.signature(Cache.__init__).parameters
    and "value_states" in inspect.signature(DynamicLayer.lazy_initialization).parameters
)
"""Whether the installed transformers' cache layers take the arguments :class:`GrowingLayer`
was written and tested against (5.x)."""


def sampling_cache() -> DynamicCache:
    """A :class:`GrowingCache`, or a plain ``DynamicCache`` under a transformers whose cache
    layers take other arguments."""
    return GrowingCache() if _FITS_TRANSFORMERS else DynamicCache()


def attention_cache(model: nn.Module) -> bool:
    """Whether every layer of ``model``'s cache holds attention keys and values only, as
    transformers lays the cache out from the model's config: what a shared prompt pass can
    hand on (and :class:`GrowingCache` holds). A model without a transformers config is
    assumed to hold attention alone."""
    text_config = getattr(getattr(model, "config", None), "get_text_config", None)
    if text_config is None:
        return True
    try:
        layers = DynamicCache(config=text_config(decoder=True)).layers
    except Exception:  # a config transformers cannot lay a cache out from: share nothing
        return False
    return all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) for layer in layers)
