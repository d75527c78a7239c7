"""Bad input: each error has a fitting type and a message naming the argument, value and fix."""

from __future__ import annotations

import math
from typing import Any

import pytest
from datasets import Dataset, IterableDataset

from cmlrl_env import CoMLRLEnv, Task
from cmlrl_env.tasks import length_feedback


def items() -> Dataset:
    return Dataset.from_dict({"prompt": ["p0", "p1"], "answer": ["a0", "a1"]})


def env_with(reward: Any = None, formatters: Any = None, **kwargs: Any) -> CoMLRLEnv:
    reward = reward or (lambda c1, c2: [0.0] * len(c1))
    return CoMLRLEnv(items(), formatters, reward, **kwargs)


def step_once(env: CoMLRLEnv) -> Any:
    env.reset()
    return env.step({"agent_0": "x", "agent_1": "y"})


# -- reward ---------------------------------------------------------------------------------------
def two_rewards(c1: list[str], c2: list[str]) -> list[float]:
    return [1.0, 1.0]


@pytest.mark.parametrize(
    "reward, error, message",
    [
        (
            two_rewards,
            ValueError,
            r"reward_func two_rewards returned 2 reward\(s\) for item 0 but was given 1 joint "
            r"response\(s\); return exactly one reward per joint response",
        ),
        (
            lambda c1, c2: ["high"],
            TypeError,
            r"reward_func <lambda> returned 'high' \(str\) at position 0 for item 0; every reward "
            r"must be a real number",
        ),
        (lambda c1, c2: [None], TypeError, r"returned None \(NoneType\) at position 0"),
        (lambda c1, c2: [True], TypeError, r"returned True \(bool\) at position 0"),
        (
            lambda c1, c2: [math.nan],
            ValueError,
            r"returned nan at position 0 for item 0; rewards must be finite \(no NaN or inf\)",
        ),
        (lambda c1, c2: [math.inf], ValueError, r"returned inf at position 0"),
        (
            lambda c1, c2: 1.0,
            TypeError,
            r"returned float 1.0 for item 0; it must return a list with one float per joint "
            r"response \(1\)",
        ),
        (lambda c1, c2: "1.0", TypeError, r"returned str '1.0'"),
    ],
)
def test_bad_reward_results_are_explained(reward: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        step_once(env_with(reward))


def test_a_type_error_inside_the_reward_propagates_unchanged_and_is_not_retried() -> None:
    calls = []

    def reward(c1: list[str], c2: list[str], *, batch_items: list[dict]) -> list[float]:
        calls.append(1)
        return [len(c1[0]) + batch_items[0]["answer"]]  # int + str: the user's own bug

    env = env_with(reward)
    with pytest.raises(TypeError, match=r"unsupported operand type") as info:
        step_once(env)
    assert len(calls) == 1
    assert info.value.__notes__ == [
        "raised by reward_func test_a_type_error_inside_the_reward_propagates_unchanged_and_is_"
        "not_retried.<locals>.reward while scoring 1 joint response(s) of item 0."
    ]


def test_the_users_own_exception_type_propagates_with_context() -> None:
    class JudgeDown(RuntimeError):
        pass

    def reward(c1: list[str], c2: list[str]) -> list[float]:
        raise JudgeDown("reward server unreachable")

    with pytest.raises(JudgeDown, match=r"reward server unreachable") as info:
        step_once(env_with(reward))
    assert "raised by reward_func" in info.value.__notes__[0]


@pytest.mark.parametrize(
    "reward, message",
    [
        (
            lambda c1: [0.0],
            r"reward_func <lambda> takes 1 positional completion parameter\(s\) "
            r"\(c1\) but the env has 2 agent\(s\); .* e.g. def reward_func\(c1, c2, \*, "
            r"batch_items=None\)",
        ),
        (lambda c1, c2, c3: [0.0], r"takes 3 positional completion parameter\(s\) \(c1, c2, c3\)"),
        (
            lambda c1, c2, *, judge: [0.0],
            r"requires keyword argument\(s\) \['judge'\] that the env "
            r"never passes; .* Give them defaults or remove them",
        ),
    ],
)
def test_reward_signature_must_fit_the_team(reward: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        env_with(reward)


def test_reward_func_is_required_and_callable() -> None:
    with pytest.raises(
        TypeError,
        match=r"CoMLRLEnv needs reward_func: CoMLRLEnv\(dataset, "
        r"formatters, reward_func\)",
    ):
        CoMLRLEnv(items(), None)
    with pytest.raises(TypeError, match=r"reward_func must be callable, got 'reward'"):
        CoMLRLEnv(items(), None, "reward")


# -- formatters -----------------------------------------------------------------------------------
def test_formatter_returning_a_non_string_is_explained() -> None:
    with pytest.raises(
        TypeError,
        match=r"the formatter of agent_1 \(.*<lambda>\) returned int 7 "
        r"on item 0; a formatter must return the prompt as a str",
    ):
        env_with(formatters=[str, lambda item: 7]).reset()


def test_formatter_reading_a_missing_field_names_the_fields() -> None:
    def formatter(item: dict) -> str:
        return item["question"]

    with pytest.raises(KeyError, match=r"question") as info:
        env_with(formatters=formatter)  # item 0 is formatted when the env is built
    assert info.value.__notes__ == [
        "raised by the formatter of agent_0 (test_formatter_reading_a_missing_field_names_the_"
        "fields.<locals>.formatter) on item 0; the item's fields are ['answer', 'prompt'].",
        "checked when the task was built, on item 0 of the dataset (columns ['prompt', "
        "'answer']); fix the dataset's columns or the formatters.",
    ]


def test_default_formatter_needs_a_prompt_field_when_the_env_is_built() -> None:
    with pytest.raises(
        KeyError,
        match=r"the default formatter reads the 'prompt' field, but the "
        r"item has only \['question'\]; add a 'prompt' column or "
        r"pass formatters=",
    ) as info:
        CoMLRLEnv(Dataset.from_dict({"question": ["q"]}), None, lambda c1, c2: [0.0])
    assert "checked when the task was built" in info.value.__notes__[-1]


def test_a_dataset_without_prompt_is_fine_for_formatters_that_do_not_read_it() -> None:
    dataset = Dataset.from_dict({"question": ["q0", "q1"]})
    env = CoMLRLEnv(dataset, lambda item: item["question"], lambda c1, c2: [0.0])
    assert env.reset()[0] == {"agent_0": "q0", "agent_1": "q0"}


def test_a_stream_is_not_read_when_the_env_is_built() -> None:
    calls = []

    def rows():  # a fresh generator per pass, counted
        calls.append(1)
        yield {"question": "q"}

    env = CoMLRLEnv(IterableDataset.from_generator(rows), None, lambda c1, c2: [0.0])
    assert calls == []
    with pytest.raises(KeyError, match="the default formatter reads the 'prompt' field"):
        env.reset()  # a stream's items are checked when they are read


def test_formatters_must_be_callables() -> None:
    with pytest.raises(TypeError, match=r"formatters\[1\] is 'brief', which is not callable"):
        env_with(formatters=[str, "brief"])
    with pytest.raises(
        TypeError,
        match=r"formatters must be None, a callable, or a list of "
        r"callables; got int",
    ):
        env_with(formatters=3, num_agents=2)


# -- transition -----------------------------------------------------------------------------------
def two_turns(transition: Any) -> CoMLRLEnv:
    return env_with(num_turns=2, external_transition=transition, early_termination_threshold=None)


@pytest.mark.parametrize(
    "transition, error, message",
    [
        (
            lambda prompt, agent_completions, num_agents: ["only one"],
            ValueError,
            r"external_transition <lambda> returned 1 prompt\(s\) for item 0; it must return a "
            r"list of 2 strings, one per agent",
        ),
        (
            lambda prompt, agent_completions, num_agents: "one string",
            ValueError,
            r"returned str prompt\(s\)",
        ),
        (
            lambda prompt, agent_completions, num_agents: ["ok", 3],
            TypeError,
            r"external_transition <lambda> returned int for agent_1 on item 0; each prompt must be "
            r"a str",
        ),
    ],
)
def test_bad_transition_results_are_explained(transition: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        step_once(two_turns(transition))


def test_transition_must_accept_the_documented_arguments() -> None:
    with pytest.raises(
        TypeError,
        match=r"external_transition .*<lambda> does not accept "
        r"\['agent_completions', 'num_agents'\]; .* def "
        r"transition\(prompt, agent_completions, num_agents, "
        r"\*\*history\)",
    ):
        two_turns(lambda prompt: [prompt, prompt])


def test_transition_needs_a_prompt_field() -> None:
    env = CoMLRLEnv(
        Dataset.from_dict({"question": ["q"]}),
        lambda item: item["question"],
        lambda c1, c2: [0.0],
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=None,
    )
    with pytest.raises(
        KeyError,
        match=r"external_transition receives prompt=item\['prompt'\], "
        r"but item 0 has only \['question'\]",
    ):
        step_once(env)


@pytest.mark.parametrize("num_turns", [0, -1, 1.5, True])
def test_num_turns_must_be_a_positive_int(num_turns: Any) -> None:
    with pytest.raises(ValueError, match=rf"num_turns must be an int >= 1, got {num_turns!r}"):
        env_with(num_turns=num_turns)


@pytest.mark.parametrize("threshold", ["0.9", math.nan, True])
def test_early_termination_threshold_must_be_a_number_or_none(threshold: Any) -> None:
    with pytest.raises(
        TypeError,
        match=r"early_termination_threshold must be a real number or "
        r"None, got .*; e.g. 0.9 to end a branch",
    ):
        env_with(early_termination_threshold=threshold)


def test_more_than_one_turn_needs_a_transition() -> None:
    with pytest.raises(
        ValueError,
        match=r"num_turns=2 needs external_transition to build the "
        r"prompts of turns 2 and later; pass "
        r"external_transition=f\(prompt, agent_completions, "
        r"num_agents, \*\*history\) or use num_turns=1",
    ):
        env_with(num_turns=2)


# -- dataset and team -----------------------------------------------------------------------------
def test_empty_dataset_is_rejected() -> None:
    with pytest.raises(
        ValueError,
        match=r"dataset is empty \(0 rows\); give at least one task "
        r"item",
    ):
        CoMLRLEnv(Dataset.from_dict({"prompt": []}), None, lambda c1, c2: [0.0])


def test_empty_stream_is_rejected_at_reset() -> None:
    stream = IterableDataset.from_generator(lambda: iter(()))
    env = CoMLRLEnv(stream, None, lambda c1, c2: [0.0])
    with pytest.raises(
        ValueError,
        match=r"^dataset is empty: the IterableDataset yielded no items; give at least one task "
        r"item\.$",
    ):
        env.reset()


def test_dataset_must_be_a_hugging_face_dataset() -> None:
    with pytest.raises(
        TypeError,
        match=r"dataset must be a datasets.Dataset or "
        r"datasets.IterableDataset, got list; build one with "
        r"Dataset.from_dict",
    ):
        CoMLRLEnv([{"prompt": "p"}], None, lambda c1, c2: [0.0])


@pytest.mark.parametrize("num_agents", [0, -2, 2.0, True])
def test_num_agents_must_be_a_positive_int(num_agents: Any) -> None:
    with pytest.raises(ValueError, match=rf"num_agents must be an int >= 1, got {num_agents!r}"):
        env_with(num_agents=num_agents)


def test_agent_count_mismatch_between_formatters_and_num_agents() -> None:
    with pytest.raises(ValueError, match=r"num_agents=3 but 2 formatters were given"):
        env_with(formatters=[str, str], num_agents=3)


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"index": 5}, IndexError, r"index 5 is outside dataset \(0..1\); pass an int in range"),
        ({"index": "0"}, IndexError, r"index '0' is outside dataset"),
        (
            {"index": 0, "item": {"prompt": "p"}},
            ValueError,
            r"reset options take 'index' or 'item', "
            r"not both",
        ),
        ({"item": "p"}, TypeError, r"options\['item'\] must be a dict task item, got str"),
    ],
)
def test_bad_reset_options_are_explained(options: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        env_with().reset(options=options)


@pytest.mark.parametrize("name", ["max_prompt_chars", "max_completion_chars"])
def test_text_limits_must_be_positive_ints(name: str) -> None:
    with pytest.raises(ValueError, match=rf"{name} must be an int >= 1, got 0"):
        env_with(**{name: 0})


# -- stepping -------------------------------------------------------------------------------------
def test_step_before_reset_is_an_error() -> None:
    with pytest.raises(
        RuntimeError,
        match=r"step\(\) was called before reset\(\); call "
        r"env.reset\(\) first",
    ):
        env_with().step({"agent_0": "x", "agent_1": "y"})


def test_step_after_the_episode_ended_is_an_error() -> None:
    env = env_with()
    step_once(env)
    with pytest.raises(
        RuntimeError,
        match=r"step\(\) was called after the episode ended "
        r"\(env.agents is empty\); call env.reset\(\)",
    ):
        env.step({"agent_0": "x", "agent_1": "y"})


@pytest.mark.parametrize(
    "actions, message",
    [
        ({"agent_0": "x"}, r"unknown: \[\], missing: \['agent_1'\]"),
        (
            {"agent_0": "x", "agent_1": "y", "agent_7": "z"},
            r"unknown: \['agent_7'\], missing: \[\]",
        ),
        ({"agent_0": "x", "bob": "y"}, r"unknown: \['bob'\], missing: \['agent_1'\]"),
    ],
)
def test_actions_must_cover_exactly_the_live_agents(actions: dict, message: str) -> None:
    env = env_with()
    env.reset()
    with pytest.raises(
        KeyError,
        match=r"actions must hold exactly the live agents "
        r"\['agent_0', 'agent_1'\]; " + message,
    ):
        env.step(actions)


@pytest.mark.parametrize(
    "action, shown",
    [(3, "int 3"), (None, "NoneType None"), (["x"], r"list \['x'\]"), (b"x", "bytes b'x'")],
)
def test_actions_must_be_strings(action: Any, shown: str) -> None:
    env = env_with()
    env.reset()
    with pytest.raises(
        TypeError,
        match=rf"the action of agent_1 must be a completion str, got "
        rf"{shown}",
    ):
        env.step({"agent_0": "x", "agent_1": action})


def test_actions_must_be_a_dict() -> None:
    env = env_with()
    env.reset()
    with pytest.raises(TypeError, match=r"actions must be a dict \{agent: completion\}, got list"):
        env.step(["x", "y"])


def test_too_long_action_names_the_limit() -> None:
    env = env_with(max_completion_chars=5)
    env.reset()
    with pytest.raises(
        ValueError,
        match=r"the action of agent_0 has 6 characters, more than "
        r"max_completion_chars=5",
    ):
        env.step({"agent_0": "x" * 6, "agent_1": "y"})


def test_group_step_checks_its_arguments() -> None:
    task = Task(None, lambda c1, c2: [0.0] * len(c1))
    root = task.initial_state({"prompt": "p"}, 0)
    with pytest.raises(
        ValueError,
        match=r"joint_actions\[0\]\[0\] must hold one completion per "
        r"agent \(2\), got \('x',\)",
    ):
        task.step_group([root], [[("x",)]])
    with pytest.raises(
        ValueError,
        match=r"one list of joint actions per state; got 1 state\(s\) "
        r"and 2 list\(s\)",
    ):
        task.step_group([root], [[("x", "y")], [("x", "y")]])
    with pytest.raises(ValueError, match=r"joint_actions\[0\] is empty"):
        task.step_group([root], [[]])
    other = task.initial_state({"prompt": "q"}, 1)
    with pytest.raises(
        ValueError,
        match=r"states\[1\] holds item 1, not 0; call it once per "
        r"item",
    ):
        task.step_group([root, other], [[("x", "y")], [("x", "y")]])
    done = task.step_group([root], [[("x", "y")]])[0][0]
    assert done.next_state is None


def test_prompt_longer_than_max_prompt_chars_is_an_error():
    from datasets import Dataset

    from cmlrl_env import CoMLRLEnv

    env = CoMLRLEnv(
        Dataset.from_dict({"prompt": ["x" * 20]}),
        None,
        lambda a, b: [0.0] * len(a),
        max_prompt_chars=10,
    )
    with pytest.raises(
        ValueError,
        match=r"the prompt of agent_0 at turn 1 of item 0 has 20 "
        r"characters, more than max_prompt_chars=10",
    ):
        env.reset()
