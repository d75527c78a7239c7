"""Seeding and determinism; the trainers' group path equals the plain env."""

from __future__ import annotations

import functools
import itertools
import random
from typing import Any

import pytest
from pettingzoo.test import parallel_seed_test

from cmlrl_env import CoMLRLEnv, ConformanceError, check_multi_turn_determinism
from cmlrl_env.tasks import (
    brief_formatter,
    detailed_formatter,
    feedback_dataset,
    feedback_ratio_reward,
    length_feedback,
    length_ratio_dataset,
    length_ratio_reward,
)


def two_turn_env(**kwargs: Any) -> CoMLRLEnv:
    return CoMLRLEnv(
        feedback_dataset(),
        [brief_formatter, detailed_formatter],
        feedback_ratio_reward,
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=None,
        **kwargs,
    )


SCRIPT = [("short", "a much longer answer"), ("", "x"), ("twelve chars", "1234567890" * 3)]


def run_episodes(env: CoMLRLEnv, num_episodes: int, seed: int = 7) -> list[tuple]:
    log: list[tuple] = [env.reset(seed=seed)]
    actions = itertools.cycle(SCRIPT)
    for episode in range(num_episodes):
        if episode:
            log.append(env.reset())
        while env.agents:
            brief, detailed = next(actions)
            log.append(env.step({"agent_0": brief, "agent_1": detailed}))
            log.append(env.state())
    return log


def test_two_fresh_envs_replay_every_turn_of_several_episodes() -> None:
    first, second = run_episodes(two_turn_env(), 5), run_episodes(two_turn_env(), 5)
    assert first == second
    assert len(first) == 1 + 4 + 5 * 2 * 2  # 5 episodes of 2 turns: step + state per turn


def test_seed_sets_the_env_rng_and_the_start_of_the_item_order() -> None:
    env_a, env_b = two_turn_env(), two_turn_env()
    obs_a, infos_a = env_a.reset(seed=3)
    obs_b, _ = env_b.reset(seed=3)
    assert env_a.np_random.random() == env_b.np_random.random()
    assert obs_a == obs_b
    # item_order="dataset": dataset order from item seed % len (here 3 of 4 items).
    assert len(feedback_dataset()) == 4 and infos_a["agent_0"]["item_index"] == 3


def test_multi_turn_determinism_check_passes_on_the_seed_tasks() -> None:
    check_multi_turn_determinism(two_turn_env, num_episodes=4)
    check_multi_turn_determinism(
        functools.partial(
            CoMLRLEnv,
            length_ratio_dataset(),
            [brief_formatter, detailed_formatter],
            length_ratio_reward,
        ),
        num_episodes=4,
    )


def test_hidden_state_from_turn_two_on_is_caught_where_pettingzoo_misses_it() -> None:
    rng = random.Random()

    def drifting_feedback(
        prompt: str,
        agent_completions: list[str],
        num_agents: int,
        prompt_history_per_agent: list[list[str]],
        **history: Any,
    ) -> list[str]:
        # Unseeded randomness, but only in the prompts of turn 3.
        late = len(prompt_history_per_agent[0]) >= 2
        return [prompt + (f" (hint {rng.random():.6f})" if late else "")] * num_agents

    def env_fn(**kwargs: Any) -> CoMLRLEnv:
        return CoMLRLEnv(
            feedback_dataset(),
            None,
            feedback_ratio_reward,
            num_turns=3,
            external_transition=drifting_feedback,
            early_termination_threshold=None,
            **kwargs,
        )

    parallel_seed_test(env_fn, num_cycles=10)  # PettingZoo 1.27 compares only the first step
    with pytest.raises(
        ConformanceError,
        match=r"episode 0, turn 2: observations differ between "
        r"two fresh envs",
    ) as info:
        check_multi_turn_determinism(env_fn)
    assert "must depend only on their arguments" in str(info.value)


def test_unseeded_randomness_in_the_reward_is_caught() -> None:
    rng = random.Random()

    def env_fn(**kwargs: Any) -> CoMLRLEnv:
        return CoMLRLEnv(
            feedback_dataset(), None, lambda c1, c2: [rng.random() for _ in c1], **kwargs
        )

    with pytest.raises(ConformanceError, match=r"episode 0, turn 1: rewards differ"):
        check_multi_turn_determinism(env_fn)


# -- one code path: Task.step_group (trainers' tree) == CoMLRLEnv.step (plain loop) ---------------
TURN_1 = [("short", "a much longer answer"), ("tiny", "tin")]
TURN_2 = [("ok", "okokokok"), ("", "still empty brief")]


def test_group_tree_equals_plain_env_episodes_along_each_branch() -> None:
    env = two_turn_env()
    task = env.task
    root = task.initial_state(env.source.get(1), 1)
    first = task.step_group([root], [TURN_1])[0]
    children = [outcome.next_state for outcome in first]
    second = task.step_group(children, [TURN_2, TURN_2])

    for b, joint_1 in enumerate(TURN_1):
        for j, joint_2 in enumerate(TURN_2):
            plain = two_turn_env()
            obs, _ = plain.reset(options={"index": 1})
            assert tuple(obs.values()) == root.prompts
            obs, rewards, terms, truncs, _ = plain.step(
                dict(zip(plain.agents, joint_1, strict=True))
            )
            assert tuple(obs.values()) == children[b].prompts
            assert rewards["agent_0"] == first[b].reward
            assert (terms["agent_0"], truncs["agent_0"]) == (first[b].terminated, False)
            _, rewards, terms, truncs, _ = plain.step(dict(zip(plain.agents, joint_2, strict=True)))
            assert rewards["agent_0"] == second[b][j].reward
            assert (terms["agent_0"], truncs["agent_0"]) == (True, False)
            assert second[b][j].terminated and second[b][j].next_state is None


def test_branch_states_are_immutable_and_independent() -> None:
    task = two_turn_env().task
    root = task.initial_state({"prompt": "p"}, None)
    a, b = (o.next_state for o in task.step_group([root], [TURN_1])[0])
    assert root.turns_played == 0 and root.response_history == ((), ())
    assert a.response_history == (("short",), ("a much longer answer",))
    assert b.response_history == (("tiny",), ("tin",))
    with pytest.raises(AttributeError):
        a.turns_played = 5  # type: ignore[misc]
