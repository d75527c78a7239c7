"""The sampling cache writes each step into room taken ahead and returns exactly what
transformers' concatenating ``DynamicLayer`` returns, through the calls ``generate`` makes."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer

from cmlrl_agents.policies.kv_cache import MIN_ROOM, GrowingCache, GrowingLayer, sampling_cache


def _states(generator: torch.Generator, batch: int, length: int) -> tuple[torch.Tensor, ...]:
    shape = (batch, 3, length, 4)  # [batch, kv heads, positions, head dim]
    return torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)


class CountingLayer(GrowingLayer):
    def __init__(self) -> None:
        super().__init__()
        self.rooms: list[int] = []  # the size of each buffer made

    def _make_room(self, *args: object) -> None:
        self.rooms.append(args[-1])  # type: ignore[arg-type]
        super()._make_room(*args)  # type: ignore[arg-type]


def test_every_update_returns_what_the_concatenating_layer_returns() -> None:
    generator = torch.Generator().manual_seed(0)
    growing, plain = CountingLayer(), DynamicLayer()
    batch = 3
    for step in range(120):
        if step == 10:  # the shared prompt pass's rows gathered to one row per sample
            index = torch.tensor([0, 0, 2, 1])
            growing.batch_select_indices(index)
            plain.batch_select_indices(index)
            batch = 4
        if step == 60:
            growing.crop(-3)
            plain.crop(-3)
        keys, values = _states(generator, batch, 5 if step == 0 else 1)
        got, want = growing.update(keys, values), plain.update(keys, values)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert growing.get_seq_length() == plain.get_seq_length()
    # 5 + 119 - 3 = 121 positions: room for 64 at the prompt; the gathered rows (not views of
    # it) at 15 positions get 64 again; full at 65, doubled to 130. Every other step wrote only
    # its own keys and values.
    assert growing.get_seq_length() == 121
    assert growing.rooms == [MIN_ROOM, MIN_ROOM, 2 * (MIN_ROOM + 1)]


def test_the_installed_transformers_gets_the_growing_cache() -> None:
    cache = sampling_cache()
    assert isinstance(cache, GrowingCache)
    keys, values = _states(torch.Generator().manual_seed(1), 2, 7)
    cache.update(keys, values, layer_idx=0)
    cache.update(keys, values, layer_idx=1)
    assert all(isinstance(layer, GrowingLayer) for layer in cache.layers)
    assert cache.get_seq_length() == 7
