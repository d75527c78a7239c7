"""The env contract: agents, task items in order, observations from formatters and transitions."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from datasets import Dataset

from cmlrl_env import CoMLRLEnv
from cmlrl_env.tasks import (
    brief_formatter,
    detailed_formatter,
    length_ratio_dataset,
    length_ratio_reward,
)


def prompts_dataset(n: int = 3) -> Dataset:
    return Dataset.from_dict({"prompt": [f"p{i}" for i in range(n)], "tag": list(range(n))})


def zero_reward(*completions: list[str], batch_items: Any = None) -> list[float]:
    return [0.0] * len(completions[0])


def play(env: CoMLRLEnv, text: str = "x") -> None:
    env.step({a: text for a in env.agents})


# -- agents ---------------------------------------------------------------------------------------
def test_agents_follow_the_episode() -> None:
    env = CoMLRLEnv(
        length_ratio_dataset(), [brief_formatter, detailed_formatter], length_ratio_reward
    )
    assert env.possible_agents == ["agent_0", "agent_1"]
    assert env.agents == []
    env.reset()
    assert env.agents == ["agent_0", "agent_1"]
    assert env.num_agents == 2 and env.max_num_agents == 2
    play(env)
    assert env.agents == []
    assert env.possible_agents == ["agent_0", "agent_1"]


def test_team_size_comes_from_the_formatter_list() -> None:
    env = CoMLRLEnv(prompts_dataset(), [str, str, str], zero_reward)
    assert env.possible_agents == ["agent_0", "agent_1", "agent_2"]


def test_team_size_comes_from_num_agents_with_one_shared_formatter() -> None:
    env = CoMLRLEnv(prompts_dataset(), lambda item: item["prompt"], zero_reward, num_agents=4)
    obs, _ = env.reset()
    assert list(obs) == ["agent_0", "agent_1", "agent_2", "agent_3"]
    assert set(obs.values()) == {"p0"}


def test_default_team_is_two_agents_reading_the_prompt_field() -> None:
    env = CoMLRLEnv(prompts_dataset(), None, zero_reward)
    obs, _ = env.reset()
    assert obs == {"agent_0": "p0", "agent_1": "p0"}


def test_formatter_count_must_match_num_agents() -> None:
    with pytest.raises(
        ValueError,
        match=r"num_agents=2 but 3 formatters were given; give one "
        r"formatter per agent",
    ):
        CoMLRLEnv(prompts_dataset(), [str, str, str], zero_reward, num_agents=2)


# -- task items -----------------------------------------------------------------------------------
def test_reset_takes_items_in_dataset_order_and_wraps_round() -> None:
    env = CoMLRLEnv(prompts_dataset(3), None, zero_reward)
    seen = []
    for _ in range(7):
        obs, infos = env.reset()
        seen.append((obs["agent_0"], infos["agent_0"]["item_index"]))
        play(env)
    assert seen == [("p0", 0), ("p1", 1), ("p2", 2), ("p0", 0), ("p1", 1), ("p2", 2), ("p0", 0)]


def test_reset_without_finishing_the_episode_still_moves_on() -> None:
    env = CoMLRLEnv(prompts_dataset(3), None, zero_reward)
    assert [env.reset()[0]["agent_0"] for _ in range(4)] == ["p0", "p1", "p2", "p0"]


def test_options_index_pins_an_item_without_moving_the_order() -> None:
    env = CoMLRLEnv(prompts_dataset(3), None, zero_reward)
    obs, infos = env.reset(options={"index": 2})
    assert obs["agent_0"] == "p2" and infos["agent_1"]["item_index"] == 2
    assert env.reset()[0]["agent_0"] == "p0"
    assert env.reset(options={"index": np.int64(1)})[0]["agent_0"] == "p1"  # as seeds may be


def test_options_item_plays_a_given_item() -> None:
    seen = []

    def reward(c1: list[str], c2: list[str], *, batch_items: list[dict]) -> list[float]:
        seen.append(batch_items[0])
        return [1.0]

    env = CoMLRLEnv(prompts_dataset(), None, reward)
    obs, infos = env.reset(options={"item": {"prompt": "custom", "answer": 42}})
    assert obs == {"agent_0": "custom", "agent_1": "custom"}
    assert infos["agent_0"]["item_index"] == -1  # GIVEN_ITEM_INDEX: never None
    play(env)
    assert seen == [{"prompt": "custom", "answer": 42}]


def test_iterable_dataset_streams_in_order_and_wraps_round() -> None:
    stream = prompts_dataset(3).to_iterable_dataset()
    env = CoMLRLEnv(stream, None, zero_reward)
    seen = []
    for _ in range(5):
        obs, infos = env.reset()
        seen.append((obs["agent_0"], infos["agent_0"]["item_index"]))
        play(env)
    assert seen == [("p0", 0), ("p1", 1), ("p2", 2), ("p0", 0), ("p1", 1)]


def test_iterable_dataset_cannot_pin_an_index() -> None:
    env = CoMLRLEnv(prompts_dataset().to_iterable_dataset(), None, zero_reward)
    with pytest.raises(TypeError, match=r"needs a map-style Dataset.*pass options=\{'item'"):
        env.reset(options={"index": 0})
    assert env.reset(options={"item": {"prompt": "given"}})[0]["agent_0"] == "given"


# -- observations ---------------------------------------------------------------------------------
def test_observations_are_the_formatters_prompts_in_actor_order() -> None:
    dataset = length_ratio_dataset()
    env = CoMLRLEnv(dataset, [brief_formatter, detailed_formatter], length_ratio_reward)
    obs, _ = env.reset()
    item = dataset[0]
    assert obs == {"agent_0": brief_formatter(item), "agent_1": detailed_formatter(item)}
    assert item["prompt"] in obs["agent_0"]


def test_dict_observations_wrap_the_prompt() -> None:
    env = CoMLRLEnv(prompts_dataset(), None, zero_reward, dict_observations=True)
    obs, _ = env.reset()
    assert obs == {"agent_0": {"prompt": "p0"}, "agent_1": {"prompt": "p0"}}
    assert env.observation_space("agent_0").contains(obs["agent_0"])


class RecordingTransition:
    """Returns numbered prompts and records every call's keyword arguments."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self, prompt: str, agent_completions: list[str], num_agents: int, **history: Any
    ) -> list[str]:
        self.calls.append(
            {
                "prompt": prompt,
                "agent_completions": agent_completions,
                "num_agents": num_agents,
                **history,
            }
        )
        turn = len(self.calls) + 1
        return [f"turn {turn} for agent {i}" for i in range(num_agents)]


def three_turn_env(transition: RecordingTransition, formatters: Any) -> CoMLRLEnv:
    return CoMLRLEnv(
        prompts_dataset(),
        formatters,
        zero_reward,
        num_turns=3,
        external_transition=transition,
        early_termination_threshold=None,
    )


def test_later_turns_observe_the_transitions_prompts_through_the_formatter() -> None:
    transition = RecordingTransition()
    env = three_turn_env(transition, lambda item: f"<{item['prompt']}|{item['tag']}>")
    obs, _ = env.reset()
    assert obs == {"agent_0": "<p0|0>", "agent_1": "<p0|0>"}
    obs, _, _, _, infos = env.step({"agent_0": "a1", "agent_1": "b1"})
    # The transition's prompt replaces item["prompt"]; the other fields are kept.
    assert obs == {"agent_0": "<turn 2 for agent 0|0>", "agent_1": "<turn 2 for agent 1|0>"}
    assert infos["agent_0"]["turn"] == 1
    obs, *_ = env.step({"agent_0": "a2", "agent_1": "b2"})
    assert obs == {"agent_0": "<turn 3 for agent 0|0>", "agent_1": "<turn 3 for agent 1|0>"}


def test_transition_receives_the_branch_history_turn_by_turn() -> None:
    transition = RecordingTransition()
    env = three_turn_env(transition, None)
    env.reset()
    env.step({"agent_0": "a1", "agent_1": "b1"})
    env.step({"agent_0": "a2", "agent_1": "b2"})
    env.step({"agent_0": "a3", "agent_1": "b3"})
    assert env.agents == []
    # Two calls: after turns 1 and 2 (the last turn needs no next prompt). Histories include the
    # turn just played; the prompt history holds the prompts the agents actually saw.
    assert transition.calls == [
        {
            "prompt": "p0",
            "agent_completions": ["a1", "b1"],
            "num_agents": 2,
            "prompt_history_per_agent": [["p0"], ["p0"]],
            "response_history_per_agent": [["a1"], ["b1"]],
        },
        {
            "prompt": "p0",
            "agent_completions": ["a2", "b2"],
            "num_agents": 2,
            "prompt_history_per_agent": [
                ["p0", "turn 2 for agent 0"],
                ["p0", "turn 2 for agent 1"],
            ],
            "response_history_per_agent": [["a1", "a2"], ["b1", "b2"]],
        },
    ]


def two_turn_env(transition: Any) -> CoMLRLEnv:
    return CoMLRLEnv(
        prompts_dataset(),
        None,
        zero_reward,
        num_turns=2,
        external_transition=transition,
        early_termination_threshold=None,
    )


def test_transition_without_history_parameters_gets_only_the_required_ones() -> None:
    calls = []

    def transition(prompt: str, agent_completions: list[str], num_agents: int) -> list[str]:
        calls.append((prompt, agent_completions, num_agents))
        return ["next a", "next b"]

    env = two_turn_env(transition)
    env.reset()
    obs, *_ = env.step({"agent_0": "x", "agent_1": "y"})
    assert calls == [("p0", ["x", "y"], 2)]
    assert obs == {"agent_0": "next a", "agent_1": "next b"}


def test_formatter_with_external_prompts_receives_the_transitions_prompt() -> None:
    received = []

    def formatter(item: dict, external_prompts: str | None = None) -> str:
        received.append(external_prompts)
        return f"[{external_prompts}] {item['prompt']}"

    env = three_turn_env(RecordingTransition(), formatter)
    assert received == [None, None]  # item 0's prompts, formatted when the env was built
    received.clear()
    obs, _ = env.reset()
    assert obs["agent_0"] == "[None] p0"
    obs, *_ = env.step({"agent_0": "a", "agent_1": "b"})
    assert obs == {
        "agent_0": "[turn 2 for agent 0] turn 2 for agent 0",
        "agent_1": "[turn 2 for agent 1] turn 2 for agent 1",
    }
    assert received == [None, None, "turn 2 for agent 0", "turn 2 for agent 1"]


def test_infos_report_turn_item_and_raw_reward() -> None:
    env = CoMLRLEnv(prompts_dataset(), None, lambda c1, c2: [0.25])
    _, infos = env.reset()
    assert infos == {
        a: {"turn": 0, "item_index": 0, "raw_reward": 0.0} for a in ("agent_0", "agent_1")
    }
    *_, infos = env.step({"agent_0": "x", "agent_1": "y"})
    assert infos["agent_1"] == {"turn": 1, "item_index": 0, "raw_reward": 0.25}


@pytest.mark.parametrize(
    "options", [None, {"index": 1}, {"item": {"prompt": "a given item"}}], ids=str
)
def test_info_keys_and_types_are_the_same_at_reset_and_every_step(options: Any) -> None:
    # TorchRL builds its info spec from the reset infos; None or a new key breaks it later.
    env = CoMLRLEnv(
        Dataset.from_dict({"prompt": ["p0", "p1"]}),
        None,
        lambda c1, c2: [0.5] * len(c1),
        num_turns=3,
        external_transition=lambda prompt, agent_completions, num_agents, **h: [prompt] * 2,
        early_termination_threshold=None,
    )
    types = {"turn": int, "item_index": int, "raw_reward": float}
    expected = {a: types for a in env.possible_agents}

    def schema(infos: dict) -> dict:
        return {a: {k: type(v) for k, v in info.items()} for a, info in infos.items()}

    _, infos = env.reset(seed=0, options=options)
    history = [infos["agent_0"]]
    assert schema(infos) == expected
    while env.agents:
        *_, infos = env.step({a: "x" for a in env.agents})
        assert schema(infos) == expected
        history.append(infos["agent_0"])
    index = {None: 0, "index": 1, "item": -1}[next(iter(options or {None: 0}))]
    assert history == [
        {"turn": 0, "item_index": index, "raw_reward": 0.0},
        {"turn": 1, "item_index": index, "raw_reward": 0.5},
        {"turn": 2, "item_index": index, "raw_reward": 0.5},
        {"turn": 3, "item_index": index, "raw_reward": 0.5},
    ]


def test_a_transition_that_names_item_gets_the_whole_task_item() -> None:
    # Only by name: comlrl's transitions take **kwargs for the history alone
    # (test_transition_receives_the_branch_history_turn_by_turn checks they get nothing more).
    items = []

    def transition(
        prompt: str, agent_completions: list[str], num_agents: int, item: dict[str, Any]
    ) -> list[str]:
        items.append(dict(item))
        return ["next a", "next b"]

    env = two_turn_env(transition)
    env.reset()
    env.step({"agent_0": "x", "agent_1": "y"})
    assert items == [dict(prompts_dataset()[0])]
