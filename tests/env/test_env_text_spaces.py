"""Every Gymnasium space utility works on every string TextSpace contains (UTF-8 bytes)."""

from __future__ import annotations

import copy
import functools

import gymnasium
import numpy as np
import pytest
from datasets import Dataset
from gymnasium.spaces import Dict, flatdim, flatten, flatten_space, unflatten
from gymnasium.vector.utils import (
    batch_space,
    concatenate,
    create_empty_array,
    create_shared_memory,
    iterate,
    read_from_shared_memory,
    write_to_shared_memory,
)
from gymnasium.wrappers import FlattenObservation

from cmlrl_env import CoMLRLEnv, TextSpace
from cmlrl_env.gymnasium_view import GYMNASIUM_ID
from cmlrl_env.spaces import TextBatch

TEXTS = [
    "",
    "plain",
    "naïve café",
    "中文提示",
    "🙂🚀",
    "mixed é 中 🙂",
    "nul\x00inside\x00",
    "\ud800",
]


@pytest.mark.parametrize("text", TEXTS)
def test_flatten_round_trips_every_string_the_space_contains(text: str) -> None:
    space = TextSpace(12)
    assert space.contains(text)
    flat = flatten(space, text)
    assert flat.dtype == np.uint8 and flat.shape == (48,) == (flatdim(space),)
    assert flatten_space(space).contains(flat)
    assert unflatten(space, flat) == text


def test_flatten_is_utf8_bytes_padded_with_0xff_by_hand() -> None:
    flat = flatten(TextSpace(2), "é🙂")  # 2 characters: 2 + 4 bytes, 2 of padding
    assert flat.tolist() == [0xC3, 0xA9, 0xF0, 0x9F, 0x99, 0x82, 0xFF, 0xFF]


def test_the_longest_encoding_of_max_length_characters_fits() -> None:
    space = TextSpace(5)
    text = "🙂" * 5
    assert unflatten(space, flatten(space, text)) == text


def test_flatten_refuses_text_outside_the_space() -> None:
    with pytest.raises(ValueError, match=r"cannot flatten 'toolong' \(str\): it is not in "):
        flatten(TextSpace(3), "toolong")


def test_unflatten_refuses_a_vector_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match=r"cannot unflatten 7 bytes into TextSpace\(.*12 bytes"):
        unflatten(TextSpace(3), np.zeros(7, dtype=np.uint8))


def test_dict_observations_flatten_and_unflatten() -> None:
    space = Dict({"prompt": TextSpace(6)})
    flat = flatten(space, {"prompt": "中文 🙂"})
    assert flat.dtype == np.uint8 and flatten_space(space).shape == (24,)
    assert unflatten(space, flat) == {"prompt": "中文 🙂"}


def test_batches_of_text_are_tuples_of_str() -> None:
    space = TextSpace(8)
    batch = batch_space(space, 3)
    assert isinstance(batch, TextBatch) and len(batch) == 3
    assert batch.contains(("a", "é", "中"))
    for batched in (space, batch):  # SuperSuit iterates the single space, Gymnasium the batch
        assert list(iterate(batched, ("a", "é", "中"))) == ["a", "é", "中"]
    assert concatenate(space, ["x", "🙂"], create_empty_array(space, n=2)) == ("x", "🙂")
    assert create_empty_array(space, n=2) == ("", "")
    with pytest.raises(TypeError, match=r"a batch of text is a tuple or list of str"):
        list(iterate(space, "abc"))


def test_shared_memory_follows_later_writes_and_copies_to_tuples() -> None:
    space = TextSpace(4)
    memory = create_shared_memory(space, n=2)
    view = read_from_shared_memory(space, memory, n=2)  # read once, as AsyncVectorEnv does
    write_to_shared_memory(space, 0, "é中", memory)
    write_to_shared_memory(space, 1, "🙂", memory)
    assert list(view) == ["é中", "🙂"]
    assert copy.deepcopy(view) == ("é中", "🙂") and type(copy.deepcopy(view)) is tuple


def non_ascii_env_fn(**kwargs: object) -> CoMLRLEnv:
    dataset = Dataset.from_dict({"prompt": ["naïve café", "中文提示", "🙂🚀 emoji"]})
    return CoMLRLEnv(
        dataset,
        None,
        lambda c1, c2: [float(len(a)) for a in c1],
        max_prompt_chars=16,
        max_completion_chars=16,
        **kwargs,
    )


PARTNERS = {"agent_1": lambda prompt: "ok"}


@pytest.mark.parametrize("dict_observations", [False, True])
def test_async_vector_env_with_shared_memory_carries_non_ascii_text(
    dict_observations: bool,
) -> None:
    env_fn = functools.partial(non_ascii_env_fn, dict_observations=dict_observations)

    def make() -> gymnasium.Env:
        return gymnasium.make(GYMNASIUM_ID, env_fn=env_fn, partners=PARTNERS)

    vector = gymnasium.vector.AsyncVectorEnv([make] * 3, shared_memory=True)
    try:
        obs, infos = vector.reset(seed=0)
        prompts = obs["prompt"] if dict_observations else obs
        assert prompts == ("naïve café", "中文提示", "🙂🚀 emoji")
        _, rewards, terms, truncs, _ = vector.step(("é", "中文", "🙂🙂🙂"))
        assert rewards.tolist() == [1.0, 2.0, 3.0] and terms.all() and not truncs.any()
        obs, *_ = vector.step(("a", "b", "c"))  # after the auto-reset: the next items
        prompts = obs["prompt"] if dict_observations else obs
        assert prompts == ("中文提示", "🙂🚀 emoji", "naïve café")
    finally:
        vector.close()


def test_flatten_observation_wrapper_on_the_single_agent_view() -> None:
    env = FlattenObservation(
        gymnasium.make(GYMNASIUM_ID, env_fn=non_ascii_env_fn, partners=PARTNERS)
    )
    obs, _ = env.reset(seed=2)
    assert obs.dtype == np.uint8 and obs.shape == (64,)
    assert unflatten(env.unwrapped.observation_space, obs) == "🙂🚀 emoji"
