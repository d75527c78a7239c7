"""Seeds decide the item order; reset options and seeds are checked; streams that cannot restart."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from datasets import Dataset, IterableDataset

from cmlrl_env import CoMLRLEnv, TaskSource


def ten_items() -> Dataset:
    return Dataset.from_dict({"prompt": [f"p{i}" for i in range(10)]})


def env_on(dataset: Dataset | IterableDataset, **kwargs: Any) -> CoMLRLEnv:
    return CoMLRLEnv(dataset, None, lambda c1, c2: [0.0] * len(c1), **kwargs)


def indices(env: CoMLRLEnv, seed: int | None, episodes: int) -> list[int]:
    """Item indices of ``episodes`` resets: the first with ``seed``, then unseeded."""
    out = [env.reset(seed=seed)[1]["agent_0"]["item_index"]]
    out += [env.reset()[1]["agent_0"]["item_index"] for _ in range(episodes - 1)]
    return out


# -- item_order="dataset" -------------------------------------------------------------------------
def test_unseeded_resets_play_the_dataset_in_order_and_wrap_round() -> None:
    env = env_on(Dataset.from_dict({"prompt": ["a", "b", "c"]}))
    assert [env.reset()[0]["agent_0"] for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_a_seed_starts_the_dataset_order_at_seed_mod_len() -> None:
    env = env_on(ten_items())
    assert indices(env, 3, 9) == [3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert indices(env, 0, 2) == [0, 1]
    assert indices(env, 47, 4) == [7, 8, 9, 0]


def test_the_same_seed_gives_the_same_episodes_and_rewinds() -> None:
    env = env_on(ten_items())
    first = indices(env, 5, 4)
    env.reset()  # move on, then rewind with the same seed
    assert indices(env, 5, 4) == first
    fresh = env_on(ten_items())
    assert indices(fresh, 5, 4) == first


def test_two_seeds_give_different_first_items() -> None:
    assert env_on(ten_items()).reset(seed=1)[0] != env_on(ten_items()).reset(seed=2)[0]


def test_copies_seeded_s_plus_i_never_play_the_same_item_in_lock_step() -> None:
    copies = [env_on(ten_items()) for _ in range(4)]
    rows = [indices(env, 100 + i, 25) for i, env in enumerate(copies)]
    for step in zip(*rows, strict=True):
        assert len(set(step)) == 4, step


def test_a_seed_restarts_a_stream_and_skips_seed_mod_length_items() -> None:
    env = env_on(ten_items().to_iterable_dataset())
    assert indices(env, 3, 9) == [3, 4, 5, 6, 7, 8, 9, 0, 1]
    assert env.reset(seed=3)[0]["agent_0"] == "p3"
    assert env.reset(seed=23)[0]["agent_0"] == "p3"  # the length is known after one pass


def test_options_pin_an_item_without_moving_the_order() -> None:
    env = env_on(ten_items())
    env.reset(seed=4)
    assert env.reset(options={"index": 9})[0]["agent_0"] == "p9"
    assert env.reset(options={"item": {"prompt": "mine"}})[0]["agent_0"] == "mine"
    assert env.reset()[0]["agent_0"] == "p5"


# -- item_order="shuffle" -------------------------------------------------------------------------
def test_shuffle_plays_a_seeded_permutation_per_pass() -> None:
    env = env_on(ten_items(), item_order="shuffle")
    played = indices(env, 7, 30)
    passes = [played[i : i + 10] for i in range(0, 30, 10)]
    assert all(sorted(p) == list(range(10)) for p in passes)
    expected = [list(np.random.default_rng([7, k]).permutation(10)) for k in range(3)]
    assert passes == expected
    assert len({tuple(p) for p in passes}) == 3  # a fresh permutation every pass
    assert indices(env_on(ten_items(), item_order="shuffle"), 7, 30) == played


def test_shuffle_orders_differ_between_seeds() -> None:
    a = indices(env_on(ten_items(), item_order="shuffle"), 0, 10)
    b = indices(env_on(ten_items(), item_order="shuffle"), 1, 10)
    assert a != b and sorted(a) == sorted(b) == list(range(10))


def test_shuffle_needs_a_map_style_dataset() -> None:
    with pytest.raises(ValueError, match=r"item_order='shuffle' needs a map-style Dataset"):
        env_on(ten_items().to_iterable_dataset(), item_order="shuffle")


def test_item_order_must_be_a_known_order() -> None:
    with pytest.raises(
        ValueError, match=r"item_order must be one of \('dataset', 'shuffle'\), got 'random'"
    ):
        env_on(ten_items(), item_order="random")


# -- reset arguments ------------------------------------------------------------------------------
@pytest.mark.parametrize("options", [{"idx": 1}, {"index": 1, "seed": 2}])
def test_unknown_reset_options_name_the_key_and_the_valid_ones(options: dict) -> None:
    env = env_on(ten_items())
    unknown = sorted(k for k in options if k != "index")
    with pytest.raises(
        ValueError,
        match=rf"unknown reset option\(s\) {re.escape(repr(unknown))}; the valid keys are "
        r"\['index', 'item'\]",
    ):
        env.reset(options=options)


@pytest.mark.parametrize("options", [[1], "index", 3])
def test_reset_options_must_be_a_dict(options: Any) -> None:
    with pytest.raises(
        TypeError, match=r"options must be None or a dict with the keys \['index', 'item'\]"
    ):
        env_on(ten_items()).reset(options=options)


@pytest.mark.parametrize(
    ("seed", "error", "shown"),
    [
        ("abc", TypeError, "str 'abc'"),
        (1.5, TypeError, "float 1.5"),
        (True, TypeError, "bool True"),
        (-1, ValueError, "-1"),
    ],
)
def test_bad_seeds_name_the_seed_and_what_is_valid(seed: Any, error: type, shown: str) -> None:
    with pytest.raises(error, match=rf"^seed must be None or an int >= 0, got {shown}"):
        env_on(ten_items()).reset(seed=seed)


def test_numpy_integer_seeds_are_ints() -> None:
    env = env_on(ten_items())
    assert env.reset(seed=np.int64(3))[1]["agent_0"]["item_index"] == 3


# -- streams that cannot restart ------------------------------------------------------------------
def one_shot_stream(n: int) -> IterableDataset:
    rows = iter([{"prompt": f"s{i}"} for i in range(n)])
    return IterableDataset.from_generator(lambda: rows)  # the same used-up iterator each pass


ONE_SHOT = (
    r"^dataset yielded no items on pass 2: it is an IterableDataset that cannot restart "
    r"\(a one-shot stream"
)


def test_a_one_shot_stream_fails_clearly_when_a_second_pass_is_needed() -> None:
    env = env_on(one_shot_stream(2))
    assert [env.reset()[0]["agent_0"] for _ in range(2)] == ["s0", "s1"]
    with pytest.raises(ValueError, match=ONE_SHOT) as info:
        env.reset()
    assert "IterableDataset.from_generator(fn) where fn creates a fresh generator" in str(
        info.value
    )


def test_a_seed_restarts_a_one_shot_stream_and_fails_clearly() -> None:
    env = env_on(one_shot_stream(2))
    assert env.reset(seed=1)[0]["agent_0"] == "s1"  # the first pass: s0 skipped
    with pytest.raises(ValueError, match=ONE_SHOT):
        env.reset(seed=1)


def _stream(n: int) -> IterableDataset:
    return IterableDataset.from_generator(lambda: ({"prompt": f"s{i}"} for i in range(n)))


@pytest.mark.parametrize("dataset", [ten_items(), _stream(10)], ids=["map", "stream"])
def test_epoch_items_read_dataset_order_from_a_position_and_leave_the_reset_order(dataset) -> None:
    # The trainers' read (SPEC §2) and a resumed run's position: epoch 2 from item 7, to 9.
    env = env_on(dataset)
    env.reset(seed=4)
    assert [(i, item["prompt"][1:]) for i, item in env.epoch_items(2, 7, 9)] == [
        (7, "7"),
        (8, "8"),
    ]
    assert [i for i, _ in TaskSource(dataset).epoch_items(1)] == list(range(10))
    assert env.reset()[1]["agent_0"]["item_index"] == 5  # the seeded order went on
