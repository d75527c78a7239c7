"""Rewards: the seed's checks, the three signature forms, one call per group, processors."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from datasets import Dataset

from cmlrl_env import CoMLRLEnv, RewardProcessors, Task
from cmlrl_env.tasks import (
    brief_formatter,
    detailed_formatter,
    feedback_ratio_reward,
    length_feedback,
    length_ratio_reward,
    length_ratio_splits,
)


def items() -> Dataset:
    return Dataset.from_dict({"prompt": ["p0", "p1"], "answer": ["a0", "a1"]})


# -- the seed's own checks (SPEC §4, §8) ----------------------------------------------------------
def test_seed_length_ratio_checks_hold() -> None:
    train_dataset, eval_dataset = length_ratio_splits()
    assert (len(train_dataset), len(eval_dataset)) == (8, 2)
    item = train_dataset[0]
    assert item["prompt"] in brief_formatter(item)
    assert item["prompt"] in detailed_formatter(item)
    assert length_ratio_reward(["Hi"], ["Hello"], batch_items=[item]) == [1.0]
    assert length_ratio_reward([""], ["Hello"], batch_items=[item]) == [0.0]


def test_seed_length_ratio_reward_is_exp_of_minus_distance() -> None:
    item = {"target_min": 2.0, "target_max": 3.0}
    # ratio 4 lies 1 above the band, ratio 1 lies 1 below it.
    assert length_ratio_reward(["ab", "ab"], ["abcdefgh", "ab"], batch_items=[item]) == [
        pytest.approx(math.exp(-1.0)),
        pytest.approx(math.exp(-1.0)),
    ]


def test_seed_two_turn_reward_and_feedback() -> None:
    assert feedback_ratio_reward(["Hi", "abcd"], ["Hello", "a"]) == [
        1.0,
        pytest.approx(math.exp(-1.75)),
    ]
    prompts = length_feedback("Describe.", ["ab", "abcde"], 2)
    assert prompts[0].startswith("Describe.\n\nYour last answer had 2 characters.")
    assert "2.5 times as long" in prompts[1] and "5 characters" in prompts[1]


# -- the three signature forms --------------------------------------------------------------------
def keyword_only(c1: list[str], c2: list[str], *, batch_items: list[dict]) -> list[float]:
    keyword_only.seen = (c1, c2, batch_items)  # type: ignore[attr-defined]
    return [1.0] * len(c1)


def positional_only(c1: list[str], c2: list[str]) -> list[float]:
    positional_only.seen = (c1, c2, None)  # type: ignore[attr-defined]
    return [1.0] * len(c1)


def defaulted(c1: list[str], c2: list[str], batch_items: list[dict] | None = None) -> list[float]:
    defaulted.seen = (c1, c2, batch_items)  # type: ignore[attr-defined]
    return [1.0] * len(c1)


def var_keyword(c1: list[str], c2: list[str], **kwargs: Any) -> list[float]:
    var_keyword.seen = (c1, c2, kwargs["batch_items"])  # type: ignore[attr-defined]
    return [1.0] * len(c1)


@pytest.mark.parametrize(
    "reward, gets_items",
    [(keyword_only, True), (defaulted, True), (var_keyword, True), (positional_only, False)],
)
def test_every_signature_form_gets_the_completions_and_batch_items(
    reward: Any, gets_items: bool
) -> None:
    env = CoMLRLEnv(items(), None, reward)
    env.reset()
    env.step({"agent_0": "first", "agent_1": "second"})
    c1, c2, batch_items = reward.seen
    assert (c1, c2) == (["first"], ["second"])
    expected = [{"prompt": "p0", "answer": "a0"}] if gets_items else None
    assert batch_items == expected


def test_defaulted_batch_items_is_not_dropped_bug_b4() -> None:
    def reward(c1: list[str], c2: list[str], batch_items: list[dict] | None = None) -> list[float]:
        assert batch_items is not None, "batch_items silently dropped"
        return [float(c == batch_items[0]["answer"]) for c in c1]

    env = CoMLRLEnv(items(), None, reward)
    env.reset()
    _, rewards, *_ = env.step({"agent_0": "a0", "agent_1": ""})
    assert rewards == {"agent_0": 1.0, "agent_1": 1.0}


# -- one call per group step, cooperative rewards -------------------------------------------------
class CountingReward:
    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str], list[dict]]] = []

    def __call__(self, c1: list[str], c2: list[str], *, batch_items: list[dict]) -> list[float]:
        self.calls.append((c1, c2, batch_items))
        return [float(len(a) + len(b)) for a, b in zip(c1, c2, strict=True)]


def test_one_reward_call_scores_every_joint_action_of_a_group() -> None:
    reward = CountingReward()
    task = Task(
        None,
        reward,
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=None,
    )
    root = task.initial_state({"prompt": "p"}, 0)
    first = task.step_group([root], [[("a", "bb"), ("ccc", "d")]])
    assert len(reward.calls) == 1
    children = [o.next_state for o in first[0]]
    second = task.step_group(children, [[("x", "y"), ("", "zz")], [("q", ""), ("rr", "ss")]])
    assert len(reward.calls) == 2
    # The lists hold every joint response of the call, branch by branch, in actor order.
    assert reward.calls[1][:2] == (["x", "", "q", "rr"], ["y", "zz", "", "ss"])
    assert reward.calls[1][2] == [{"prompt": "p"}]
    assert [[o.reward for o in row] for row in second] == [[2.0, 2.0], [1.0, 4.0]]


def test_the_plain_env_calls_the_reward_once_per_step() -> None:
    reward = CountingReward()
    env = CoMLRLEnv(
        items(),
        None,
        reward,
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=None,
    )
    env.reset()
    env.step({"agent_0": "a", "agent_1": "b"})
    env.step({"agent_0": "a", "agent_1": "b"})
    assert len(reward.calls) == 2


def test_rewards_are_cooperative_for_every_agent() -> None:
    env = CoMLRLEnv(items(), [str, str, str], lambda a, b, c: [len(a[0] + b[0] + c[0]) / 10])
    env.reset()
    _, rewards, *_ = env.step({"agent_0": "ab", "agent_1": "c", "agent_2": ""})
    assert rewards == {"agent_0": 0.3, "agent_1": 0.3, "agent_2": 0.3}
    assert all(isinstance(r, float) for r in rewards.values())


def test_numpy_rewards_are_accepted_as_floats() -> None:
    env = CoMLRLEnv(items(), None, lambda c1, c2: np.array([0.5], dtype=np.float32))
    env.reset()
    _, rewards, *_ = env.step({"agent_0": "x", "agent_1": "y"})
    assert rewards["agent_0"] == 0.5 and type(rewards["agent_0"]) is float


# -- reward processors ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "processor, raw, expected",
    [
        (RewardProcessors.identity(), 0.5, 0.5),
        (RewardProcessors.scale(factor=10.0), 0.5, 5.0),
        (RewardProcessors.shift(value=-1.0), 0.5, -0.5),
        (RewardProcessors.clip(low=0.0, high=0.3), 0.5, 0.3),
        (RewardProcessors.clip(low=0.7), 0.5, 0.7),
        (
            RewardProcessors.compose(RewardProcessors.scale(2.0), RewardProcessors.shift(1.0)),
            0.5,
            2.0,
        ),
        (
            RewardProcessors.compose(RewardProcessors.shift(1.0), RewardProcessors.scale(2.0)),
            0.5,
            3.0,
        ),
        (lambda r: r**2, 0.5, 0.25),
    ],
)
def test_reward_processor_transforms_rewards_and_keeps_the_raw_one(
    processor: Any, raw: float, expected: float
) -> None:
    env = CoMLRLEnv(items(), None, lambda c1, c2: [raw], reward_processor=processor)
    env.reset()
    _, rewards, _, _, infos = env.step({"agent_0": "x", "agent_1": "y"})
    assert rewards == {"agent_0": expected, "agent_1": expected}
    assert infos["agent_0"]["raw_reward"] == raw


def test_processors_have_readable_names() -> None:
    composed = RewardProcessors.compose(
        RewardProcessors.scale(factor=10.0), RewardProcessors.clip(low=0.0, high=1.0)
    )
    assert repr(composed) == "compose(scale(factor=10.0), clip(low=0.0, high=1.0))"


def test_processor_output_must_be_finite() -> None:
    env = CoMLRLEnv(
        items(),
        None,
        lambda c1, c2: [0.0],
        reward_processor=lambda r: math.log(r) if r > 0 else float("nan"),
    )
    env.reset()
    with pytest.raises(
        ValueError,
        match=r"reward_processor .* turned reward 0.0 into nan; it "
        r"must return a finite real number",
    ):
        env.step({"agent_0": "x", "agent_1": "y"})


@pytest.mark.parametrize(
    "build, message",
    [
        (
            lambda: RewardProcessors.scale(factor=float("inf")),
            r"factor must be a finite real number",
        ),
        (lambda: RewardProcessors.shift(value="1"), r"value must be a finite real number, got '1'"),
        (lambda: RewardProcessors.clip(low=1.0, high=0.0), r"clip needs low <= high, got low=1.0"),
        (
            lambda: RewardProcessors.compose(RewardProcessors.scale(2.0), 3),
            r"compose argument 1 is 3, which is not callable",
        ),
    ],
)
def test_processor_arguments_are_checked(build: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        build()


def test_reward_processor_must_be_callable() -> None:
    with pytest.raises(
        TypeError,
        match=r"reward_processor must be callable float -> float, "
        r"got 10",
    ):
        CoMLRLEnv(items(), None, lambda c1, c2: [0.0], reward_processor=10)
