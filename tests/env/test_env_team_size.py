"""An env's memory per agent stays small (the text spaces share their character tables), and a
team size far beyond any trainable team is refused with the bound and the reason."""

from __future__ import annotations

import string
import tracemalloc
from typing import Any

import pytest
from datasets import Dataset
from gymnasium import spaces

from cmlrl_env import MAX_AGENTS, CoMLRLEnv, TextSpace


def any_reward(*completions: list[str], batch_items: Any = None) -> list[float]:
    return [0.0] * len(completions[0])


def team(num_agents: int) -> CoMLRLEnv:
    dataset = Dataset.from_dict({"prompt": ["p0"]})
    return CoMLRLEnv(dataset, lambda item: item["prompt"], any_reward, num_agents=num_agents)


def held_by_a_team(num_agents: int) -> int:
    """Bytes still allocated after building an env of ``num_agents`` agents."""
    team(2)  # imports and caches outside the measurement
    tracemalloc.start()
    try:
        env = team(num_agents)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(env.possible_agents) == num_agents
    return held


def test_an_agent_costs_the_env_under_2_kb_before_any_reset() -> None:
    # Each agent's two spaces used to rebuild Gymnasium Text's tables: ~30 KB per agent.
    held = held_by_a_team(1000)
    assert held / 1000 < 2_000, f"{held / 1000:.0f} bytes per agent"


def test_every_space_shares_one_copy_of_the_character_tables() -> None:
    env = team(3)
    a, b = env.action_space("agent_0"), env.observation_space("agent_2")
    assert a is not b  # seeding one agent's space leaves the others alone
    assert a._char_index is b._char_index and a._char_list is b._char_list


def test_sampling_is_gymnasiums_printable_text_sampling() -> None:
    ours = TextSpace(40, seed=3).sample()
    theirs = spaces.Text(40, min_length=0, charset=string.printable, seed=3).sample()
    assert ours == theirs and set(ours) <= set(string.printable)


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_text_space_keeps_texts_checks_of_its_bounds(bad: Any) -> None:
    # checked by TextSpace itself: Gymnasium before 1.4 only asserts (AssertionError)
    with pytest.raises((TypeError, ValueError), match=rf"max_length.*{bad!r}|max_length={bad}"):
        TextSpace(bad)


def test_a_team_of_2000_builds_in_a_few_megabytes() -> None:
    assert held_by_a_team(2000) < 4_000_000  # was ~61 MB


@pytest.mark.parametrize("num_agents", [MAX_AGENTS + 1, 10**6])
def test_a_larger_team_is_refused_with_the_bound_and_why(num_agents: int) -> None:
    assert MAX_AGENTS == 10_000
    with pytest.raises(ValueError) as error:
        team(num_agents)
    message = str(error.value)
    assert f"num_agents={num_agents} is more than MAX_AGENTS=10000" in message
    assert "Every agent answers at every turn" in message
    assert "almost always a mistake" in message


def test_a_formatter_list_beyond_the_bound_is_refused_too() -> None:
    dataset = Dataset.from_dict({"prompt": ["p0"]})
    with pytest.raises(ValueError, match="num_agents=10001 is more than MAX_AGENTS"):
        CoMLRLEnv(dataset, [lambda item: item["prompt"]] * 10_001, any_reward)


def test_a_reward_that_does_not_fit_a_big_team_gets_a_short_example() -> None:
    dataset = Dataset.from_dict({"prompt": ["p0"]})
    with pytest.raises(TypeError) as error:
        CoMLRLEnv(dataset, None, lambda c1, c2: [0.0], num_agents=600)
    message = str(error.value)
    assert message.endswith("e.g. def reward_func(*completions, batch_items=None).")
    assert len(message) < 300
