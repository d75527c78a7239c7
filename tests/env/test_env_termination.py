"""Termination: the task's end and an early end (never truncation); the threshold warning."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import gymnasium
import pytest
from datasets import Dataset

from cmlrl_env import (
    DEFAULT_EARLY_TERMINATION_THRESHOLD,
    CoMLRLEnv,
    ConformanceError,
    Task,
    check_text_contract,
)
from cmlrl_env.gymnasium_view import GYMNASIUM_ID
from cmlrl_env.tasks import feedback_dataset, feedback_ratio_reward, length_feedback


def constant(value: float) -> Callable[..., list[float]]:
    return lambda c1, c2: [value] * len(c1)


def multi_turn_env(
    reward: Callable[..., list[float]], num_turns: int = 2, **kwargs: object
) -> CoMLRLEnv:
    return CoMLRLEnv(
        Dataset.from_dict({"prompt": ["p0", "p1"]}),
        None,
        reward,
        num_turns=num_turns,
        external_transition=length_feedback,
        **kwargs,
    )


def step(env: CoMLRLEnv) -> tuple[dict, dict, dict]:
    _, rewards, terms, truncs, _ = env.step({a: "answer" for a in env.agents})
    return rewards, terms, truncs


def test_default_threshold_is_the_seeds() -> None:
    assert DEFAULT_EARLY_TERMINATION_THRESHOLD == -0.2


def test_single_turn_episode_terminates_after_one_step() -> None:
    # The last reward scores the last answer: the task is over, nothing is left to bootstrap.
    env = CoMLRLEnv(Dataset.from_dict({"prompt": ["p"]}), None, constant(0.5))
    env.reset()
    _, terms, truncs = step(env)
    assert terms == {"agent_0": True, "agent_1": True}
    assert truncs == {"agent_0": False, "agent_1": False}
    assert env.agents == []


def test_episode_terminates_after_num_turns() -> None:
    env = multi_turn_env(constant(0.5), num_turns=3, early_termination_threshold=None)
    env.reset()
    history = [step(env)[1:] for _ in range(3)]
    assert [(t["agent_0"], tr["agent_0"]) for t, tr in history] == [
        (False, False),
        (False, False),
        (True, False),
    ]
    assert env.agents == []


def test_episode_ends_early_when_the_reward_exceeds_the_threshold() -> None:
    env = multi_turn_env(constant(0.95), num_turns=3, early_termination_threshold=0.9)
    env.reset()
    _, terms, truncs = step(env)
    assert terms == {"agent_0": True, "agent_1": True}
    assert truncs == {"agent_0": False, "agent_1": False}
    assert env.agents == []


@pytest.mark.parametrize("reward", [0.5, 0.9])
def test_episode_goes_on_when_the_reward_does_not_exceed_the_threshold(reward: float) -> None:
    env = multi_turn_env(constant(reward), early_termination_threshold=0.9)
    env.reset()
    _, terms, _ = step(env)
    assert terms["agent_0"] is False and env.agents == ["agent_0", "agent_1"]
    _, terms, truncs = step(env)
    assert (terms["agent_0"], truncs["agent_0"]) == (True, False)


def test_threshold_compares_the_processed_reward() -> None:
    env = multi_turn_env(
        constant(0.5), early_termination_threshold=0.9, reward_processor=lambda r: r * 2
    )
    env.reset()
    _, terms, _ = step(env)
    assert terms["agent_0"] is True


def test_group_branches_end_independently() -> None:
    task = Task(
        None,
        lambda c1, c2: [1.0 if c == "good" else 0.0 for c in c1],
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=0.9,
    )
    root = task.initial_state({"prompt": "p"}, 0)
    good, bad = task.step_group([root], [[("good", "x"), ("bad", "x")]])[0]
    assert (good.terminated, good.next_state) == (True, None)
    assert bad.terminated is False and bad.next_state is not None


def test_default_threshold_warns_once_when_multi_turn_collapses_to_one_turn() -> None:
    env = CoMLRLEnv(
        feedback_dataset(),
        None,
        feedback_ratio_reward,
        num_turns=2,
        external_transition=length_feedback,
    )
    env.reset()
    with pytest.warns(UserWarning) as record:
        _, terms, _ = step(env)
    assert terms["agent_0"] is True and env.agents == []
    message = str(record[0].message)
    assert "num_turns=2, but every branch ended after turn 1" in message
    assert "early_termination_threshold=-0.2" in message
    assert "Pass early_termination_threshold=None" in message and "(e.g. 0.9)" in message
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env.reset()
        step(env)  # warned once per env: no second warning


def test_group_step_warns_with_the_default_threshold_when_every_branch_ends() -> None:
    task = Task(None, constant(0.0), num_turns=2, external_transition=length_feedback)
    root = task.initial_state({"prompt": "p"}, 0)
    with pytest.warns(UserWarning, match=r"every branch ended after turn 1"):
        task.step_group([root], [[("a", "b"), ("c", "d")]])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"early_termination_threshold": None},
        {"early_termination_threshold": 0.9},
        {"num_turns": 1},
    ],
)
def test_no_warning_when_the_threshold_is_chosen_or_there_is_one_turn(kwargs: dict) -> None:
    env = multi_turn_env(constant(0.5), **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            env.reset()
            while env.agents:
                step(env)


def test_no_warning_when_some_branch_goes_on() -> None:
    task = Task(
        None,
        lambda c1, c2: [-1.0 if c == "bad" else 1.0 for c in c1],
        num_turns=2,
        external_transition=length_feedback,
    )
    root = task.initial_state({"prompt": "p"}, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task.step_group([root], [[("bad", "x"), ("good", "x")]])


def test_an_external_limit_truncates_while_the_task_end_terminates() -> None:
    env_fn = functools.partial(
        multi_turn_env, constant(0.5), num_turns=3, early_termination_threshold=None
    )
    partners = {"agent_1": lambda prompt: "answer"}
    limited = gymnasium.make(GYMNASIUM_ID, env_fn=env_fn, partners=partners, max_episode_steps=2)
    limited.reset(seed=0)
    assert limited.step("answer")[2:4] == (False, False)
    assert limited.step("answer")[2:4] == (False, True)  # TimeLimit: a limit outside the task
    unlimited = gymnasium.make(GYMNASIUM_ID, env_fn=env_fn, partners=partners)
    unlimited.reset(seed=0)
    assert [unlimited.step("answer")[2:4] for _ in range(3)] == [
        (False, False),
        (False, False),
        (True, False),
    ]


def test_the_text_contract_rejects_an_env_that_truncates_its_own_task() -> None:
    class Truncating(CoMLRLEnv):
        def step(self, actions):  # type: ignore[no-untyped-def]
            obs, rewards, terms, truncs, infos = super().step(actions)
            return obs, rewards, {a: False for a in terms}, {a: True for a in truncs}, infos

    def env_fn(**kwargs: object) -> CoMLRLEnv:
        return Truncating(Dataset.from_dict({"prompt": ["p"]}), None, constant(0.5), **kwargs)

    with pytest.raises(ConformanceError, match=r"terminations .* after the last of num_turns=1"):
        check_text_contract(env_fn)
