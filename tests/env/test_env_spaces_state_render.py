"""Spaces hold any text, state() is the joint transcript, render shows it."""

from __future__ import annotations

import string

import pytest
from datasets import Dataset
from gymnasium import spaces

from cmlrl_env import CoMLRLEnv, TextSpace
from cmlrl_env.tasks import length_feedback

UNICODE = "naïve café 🙂 中文"


def make_env(**kwargs: object) -> CoMLRLEnv:
    return CoMLRLEnv(
        Dataset.from_dict({"prompt": ["Say hi."]}), None, lambda c1, c2: [0.5] * len(c1), **kwargs
    )


# -- spaces ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [UNICODE, "", "def f(x):\n\treturn x", "x" * 20])
def test_action_and_observation_spaces_hold_any_text_within_the_limit(text: str) -> None:
    env = make_env(max_prompt_chars=20, max_completion_chars=20)
    assert env.action_space("agent_0").contains(text)
    assert env.observation_space("agent_1").contains(text)


@pytest.mark.parametrize("value", [5, None, b"bytes", ["a"], "x" * 21])
def test_spaces_reject_non_text_and_too_long_text(value: object) -> None:
    env = make_env(max_prompt_chars=20, max_completion_chars=20)
    assert not env.action_space("agent_0").contains(value)
    assert not env.observation_space("agent_0").contains(value)


def test_unicode_completion_is_a_valid_action() -> None:
    env = make_env()
    env.reset()
    _, rewards, *_ = env.step({"agent_0": UNICODE, "agent_1": UNICODE})
    assert rewards["agent_0"] == 0.5


def test_sample_is_printable_and_within_the_limit() -> None:
    space = make_env(max_completion_chars=50).action_space("agent_0")
    for _ in range(20):
        text = space.sample()
        assert isinstance(text, str) and len(text) <= 50
        assert set(text) <= set(string.printable)
        assert space.contains(text)


def test_seeded_samples_repeat() -> None:
    a, b = TextSpace(30, seed=3), TextSpace(30, seed=3)
    assert [a.sample() for _ in range(5)] == [b.sample() for _ in range(5)]


def test_spaces_are_the_same_object_on_every_call_and_one_per_agent() -> None:
    env = make_env()
    for method in (env.action_space, env.observation_space):
        assert method("agent_0") is method("agent_0")
        assert method("agent_0") is not method("agent_1")  # seeding one leaves the other alone


def test_lengths_count_characters_not_bytes() -> None:
    space = TextSpace(4)
    assert space.contains("🙂🙂🙂🙂") and not space.contains("🙂🙂🙂🙂🙂")
    assert repr(space) == "TextSpace(min_length=0, max_length=4)"


def test_dict_observation_space_wraps_the_prompt_space() -> None:
    env = make_env(dict_observations=True, max_prompt_chars=20)
    space = env.observation_space("agent_0")
    assert isinstance(space, spaces.Dict)
    assert space.contains({"prompt": UNICODE})
    assert not space.contains(UNICODE)


# -- state ----------------------------------------------------------------------------------------
def test_state_is_the_joint_transcript() -> None:
    env = CoMLRLEnv(
        Dataset.from_dict({"prompt": ["Say hi."]}),
        None,
        lambda c1, c2: [0.0],
        num_turns=2,
        external_transition=lambda prompt, agent_completions, num_agents: ["again 0", "again 1"],
        early_termination_threshold=None,
    )
    env.reset()
    assert env.state() == ("[agent_0 turn 1 prompt]\nSay hi.\n\n[agent_1 turn 1 prompt]\nSay hi.")
    env.step({"agent_0": "hi", "agent_1": "hello"})
    env.step({"agent_0": "hi!", "agent_1": "hello!"})
    assert env.state() == (
        "[agent_0 turn 1 prompt]\nSay hi.\n\n[agent_0 turn 1 response]\nhi\n\n"
        "[agent_0 turn 2 prompt]\nagain 0\n\n[agent_0 turn 2 response]\nhi!\n\n"
        "[agent_1 turn 1 prompt]\nSay hi.\n\n[agent_1 turn 1 response]\nhello\n\n"
        "[agent_1 turn 2 prompt]\nagain 1\n\n[agent_1 turn 2 response]\nhello!"
    )
    assert env.state_space.contains(env.state())


def test_state_space_holds_the_longest_transcript() -> None:
    env = CoMLRLEnv(
        Dataset.from_dict({"prompt": ["p" * 10]}),
        None,
        lambda c1, c2: [0.0],
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=None,
        max_prompt_chars=400,
        max_completion_chars=10,
    )
    env.reset()
    env.step({"agent_0": "a" * 10, "agent_1": "b" * 10})
    env.step({"agent_0": "a" * 10, "agent_1": "b" * 10})
    assert isinstance(env.state_space, TextSpace)
    assert env.state_space.contains(env.state())


def test_state_before_reset_is_an_error() -> None:
    with pytest.raises(
        RuntimeError,
        match=r"state\(\) was called before reset\(\); call "
        r"env.reset\(\) first",
    ):
        make_env().state()


# -- render ---------------------------------------------------------------------------------------
def test_render_ansi_returns_the_transcript_and_reward() -> None:
    env = make_env(render_mode="ansi")
    env.reset()
    assert env.render().startswith("item 0 · turn 0/1\n[agent_0 turn 1 prompt]\nSay hi.")
    env.step({"agent_0": "hi", "agent_1": "hello"})
    text = env.render()
    assert text.startswith("item 0 · turn 1/1 · reward 0.5\n")
    assert "[agent_1 turn 1 response]\nhello" in text


def test_render_names_a_given_item_as_infos_do() -> None:
    env = make_env(render_mode="ansi")
    env.reset(options={"item": {"prompt": "Say bye."}})
    assert env.render().startswith("item -1 · turn 0/1\n")


def test_render_human_prints_on_every_step(capsys: pytest.CaptureFixture[str]) -> None:
    env = make_env(render_mode="human")
    env.reset()
    env.step({"agent_0": "hi", "agent_1": "hello"})
    assert "reward 0.5" in capsys.readouterr().out
    assert env.render() is None
    assert "[agent_1 turn 1 response]\nhello" in capsys.readouterr().out


def test_render_without_a_mode_returns_none() -> None:
    env = make_env()
    env.reset()
    assert env.render() is None


def test_unsupported_render_mode_is_an_error() -> None:
    with pytest.raises(
        ValueError,
        match=r"render_mode='rgb_array' is not supported; choose one "
        r"of \['ansi', 'human'\] or None",
    ):
        make_env(render_mode="rgb_array")
