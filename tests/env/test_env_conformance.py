"""The shipped conformance suite: check_env on the seed tasks, check_task on good and bad tasks."""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any

import pytest
from datasets import Dataset
from pettingzoo.test import api_test
from pettingzoo.utils import parallel_to_aec

from cmlrl_env import (
    CoMLRLEnv,
    ConformanceError,
    TaskCheckError,
    TaskReport,
    check_env,
    check_task,
    check_text_contract,
)
from cmlrl_env.tasks import (
    brief_formatter,
    detailed_formatter,
    feedback_dataset,
    feedback_ratio_reward,
    length_feedback,
    length_ratio_dataset,
    length_ratio_reward,
)

ALL_CHECKS = (
    "parallel_api_test",
    "parallel_seed_test",
    "render_test",
    "api_test(dict_observations=True)",
    "state_test",
    "multi_turn_determinism",
    "text_contract",
)

length_ratio_env = functools.partial(
    CoMLRLEnv, length_ratio_dataset(), [brief_formatter, detailed_formatter], length_ratio_reward
)


# -- check_env ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make_env_fn",  # given the feedback_env fixture (parametrize cannot take a fixture)
    [
        lambda feedback: length_ratio_env,
        lambda feedback: feedback,
        lambda feedback: functools.partial(feedback, early_termination_threshold=0.9),
        lambda feedback: functools.partial(
            length_ratio_env, max_completion_chars=64, max_prompt_chars=256
        ),
        lambda feedback: functools.partial(
            CoMLRLEnv,
            length_ratio_dataset().to_iterable_dataset(),
            [brief_formatter, detailed_formatter],
            length_ratio_reward,
        ),
    ],
    ids=[
        "length_ratio_1_turn",
        "feedback_2_turns",
        "feedback_threshold_0.9",
        "short_limits",
        "streamed",
    ],
)
def test_check_env_passes_on_the_seed_tasks(make_env_fn: Any, feedback_env: Any) -> None:
    env_fn = make_env_fn(feedback_env)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the text-space noise of PettingZoo's tests is filtered
        assert check_env(env_fn, num_cycles=5, num_episodes=3) == ALL_CHECKS


def test_check_env_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    check_env(length_ratio_env, num_cycles=2, num_episodes=1)
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_cycles": 0}, r"num_cycles must be an int >= 1, got 0"),
        ({"num_episodes": 1.5}, r"num_episodes must be an int >= 1, got 1.5"),
    ],
)
def test_check_env_checks_its_own_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_env(length_ratio_env, **kwargs)


def test_check_env_passes_with_the_default_threshold_and_says_why_turn_two_is_skipped(
    feedback_env: Any,
) -> None:
    env_fn = functools.partial(feedback_env, early_termination_threshold=-0.2)
    with pytest.warns(UserWarning, match=r"every branch ended after turn 1"):
        assert check_env(env_fn, num_cycles=5) == ALL_CHECKS


def test_bare_string_observations_cannot_pass_the_aec_api_test() -> None:
    # Why check_env runs api_test on dict_observations=True (documented in conformance.py).
    with (
        warnings.catch_warnings(),
        pytest.raises(
            AttributeError,
            match=r"'str' object has no "
            r"attribute 'dtype'",
        ),
    ):
        warnings.simplefilter("ignore")  # "Observation is not a NumPy array" comes first
        api_test(parallel_to_aec(length_ratio_env()), num_cycles=2)


def test_check_env_wants_a_factory_not_an_env() -> None:
    with pytest.raises(
        TypeError,
        match=r"env_fn must be a function that builds a fresh env, got "
        r"CoMLRLEnv; pass e.g. functools.partial\(CoMLRLEnv",
    ):
        check_env(length_ratio_env())


def test_check_env_names_a_factory_that_drops_keyword_arguments() -> None:
    def env_fn() -> CoMLRLEnv:
        return length_ratio_env()

    with pytest.raises(
        ConformanceError,
        match=r"render_test failed: TypeError: .*unexpected "
        r"keyword argument 'render_mode'.*hint: env_fn is "
        r"called as env_fn\(render_mode=mode\)",
    ) as info:
        check_env(env_fn)
    assert info.value.check == "render_test"
    assert isinstance(info.value.__cause__, TypeError)


def test_check_env_reports_a_reward_that_cannot_take_random_completions() -> None:
    def fragile(c1: list[str], c2: list[str]) -> list[float]:
        return [len(b) / len(a) for a, b in zip(c1, c2, strict=True)]  # "" happens

    env_fn = functools.partial(CoMLRLEnv, feedback_dataset(), None, fragile, max_completion_chars=2)
    with pytest.raises(
        ConformanceError,
        match=r"failed: ZeroDivisionError: division by zero "
        r"\(raised by reward_func .*fragile",
    ) as info:
        check_env(env_fn, num_cycles=20)
    assert isinstance(info.value, AssertionError)
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_check_env_reports_hidden_state() -> None:
    calls = iter(range(10**6))

    def counting(c1: list[str], c2: list[str]) -> list[float]:
        return [float(next(calls))] * len(c1)

    env_fn = functools.partial(CoMLRLEnv, feedback_dataset(), None, counting)
    with pytest.raises(
        ConformanceError,
        match=r"(?s)parallel_seed_test failed: AssertionError: "
        r"Incorrect values for rewards.*hint: reward_func",
    ):
        check_env(env_fn)


def test_text_contract_reports_prompts_longer_than_their_space() -> None:
    # CoMLRLEnv itself refuses such a prompt at reset; the contract check covers any env that
    # hands one out anyway (here: one whose limit check is bypassed).
    class Lenient(CoMLRLEnv):
        max_prompt_chars = property(lambda self: 10**9, lambda self, value: None)

    base = functools.partial(length_ratio_env, max_prompt_chars=10)
    env_fn = functools.partial(_lenient, base, Lenient)
    with pytest.raises(
        ConformanceError,
        match=r"text_contract failed: episode 0, reset: the "
        r"observation of agent_0 \(str, 'Write a sh.*is "
        r"outside TextSpace\(min_length=0, "
        r"max_length=10\).*raise max_prompt_chars",
    ):
        check_text_contract(env_fn)
    with pytest.raises(ValueError, match="more than max_prompt_chars=10"):
        check_text_contract(base)


def _lenient(base, cls, **kwargs):
    env = base(**kwargs)
    env.__class__ = cls
    return env


# -- check_task -----------------------------------------------------------------------------------
def test_check_task_passes_on_the_one_turn_seed_task() -> None:
    report = check_task(
        length_ratio_dataset(), [brief_formatter, detailed_formatter], length_ratio_reward
    )
    assert isinstance(report, TaskReport) and report.ok
    assert report.problems == () and report.warnings == ()
    assert report.checked[:2] == (
        "item 0: prompts of [67, 70] characters",
        "item 0, turn 1: rewards 0, 1, 3.372e-06, 0.164, 0.02093, 0.1353",
    )
    assert str(report).startswith("check_task: 0 problem(s), 0 warning(s)\nChecked:\n  - item 0")


def test_check_task_plays_every_turn_of_the_two_turn_seed_task() -> None:
    report = check_task(
        feedback_dataset(),
        None,
        feedback_ratio_reward,
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=0.9,
        num_items=2,
    )
    assert report.ok and report.warnings == ()
    assert [line.split(":")[0].split(" reads")[0] for line in report.checked] == [
        "item 0",
        "item 0, turn 1",
        "item 0, turn 2, agent_0",  # the first item's turn-2 prompts are shown
        "item 0, turn 2, agent_1",
        "item 0, turn 2",
        "item 1",
        "item 1, turn 1",
        "item 1, turn 2",
    ]
    assert report.checked[4].startswith("item 0, turn 2: 36 rewards from")
    # the first joint sample is ("", "Hi"): 0 and 2 characters
    assert report.checked[2] == (
        "item 0, turn 2, agent_0 reads 'Describe a city in the clouds:\\n\\nYour last answer had "
        "0 characters. The second answer was 2.0 times as long as the first; the goal is 2 to 3 "
        "times. Please write ' ... (179 chars) (the transition's prompt as it "
        "returned it)"
    )


def test_check_task_shows_a_formatter_wrapping_the_transitions_prompt() -> None:
    def quiz(item: dict) -> str:
        return f"Write one quiz question about {item['prompt']}"

    def echo(prompt: str, agent_completions: list[str], num_agents: int) -> list[str]:
        return [f"You asked: {c}" for c in agent_completions]

    report = check_task(
        Dataset.from_dict({"prompt": ["owls"]}),
        quiz,
        lambda c1, c2: [float(len(a) < len(b)) for a, b in zip(c1, c2, strict=True)],
        num_turns=2,
        external_transition=echo,
        early_termination_threshold=None,
        sample_completions=[["Who?", "What?"], ["Why?", "Where?"]],
        num_items=1,
    )
    assert report.checked[2:4] == (
        "item 0, turn 2, agent_0 reads 'Write one quiz question about You asked: Who?' (the "
        "transition's prompt after agent_0's formatter)",
        "item 0, turn 2, agent_1 reads 'Write one quiz question about You asked: Why?' (the "
        "transition's prompt after agent_1's formatter)",
    )


def test_check_task_warns_when_the_default_threshold_collapses_multi_turn() -> None:
    report = check_task(
        feedback_dataset(),
        None,
        feedback_ratio_reward,
        num_turns=2,
        external_transition=length_feedback,
    )
    assert report.ok
    assert report.warnings == (
        "item 0: every sample reward exceeds early_termination_threshold=-0.2, so every branch "
        "would end after turn 1 of 2; pass early_termination_threshold=None to always play "
        "every turn, or a threshold only good answers reach (e.g. 0.9).",
    )


def test_check_task_lists_every_problem_of_a_formatter_returning_int() -> None:
    with pytest.raises(TaskCheckError) as info:
        check_task(
            length_ratio_dataset(),
            [brief_formatter, lambda item: len(item["prompt"])],
            length_ratio_reward,
            num_items=2,
        )
    report = info.value.report
    assert not report.ok and len(report.problems) == 2
    assert report.problems[0].startswith(
        "item 0, formatter of agent_1: TypeError: the formatter of agent_1 ("
    )
    assert (
        "returned int 30 on item 0; a formatter must return the prompt as a str"
        in report.problems[0]
    )
    assert report.problems[1].startswith("item 1, formatter of agent_1: TypeError")
    assert isinstance(info.value, ValueError) and isinstance(info.value.__cause__, TypeError)
    assert str(info.value).startswith("check_task: 2 problem(s), 0 warning(s)\nProblems:\n")


def test_check_task_reports_a_wrong_reward_count() -> None:
    def one_reward(c1: list[str], c2: list[str]) -> list[float]:
        return [1.0]

    with pytest.raises(
        TaskCheckError,
        match=r"item 0, turn 1, scoring 6 joint responses: "
        r"ValueError: reward_func .*one_reward returned 1 "
        r"reward\(s\) for item 0 but was given 6",
    ) as info:
        check_task(length_ratio_dataset(), None, one_reward, num_items=1)
    # Scoring a single joint response works, so that check adds nothing new.
    assert len(info.value.report.problems) == 1


def test_check_task_reports_a_reward_crashing_on_empty_completions() -> None:
    def fragile(c1: list[str], c2: list[str]) -> list[float]:
        return [len(b) / len(a) for a, b in zip(c1, c2, strict=True)]

    with pytest.raises(
        TaskCheckError,
        match=r"ZeroDivisionError: division by zero \(raised by "
        r"reward_func .*fragile while scoring 6 joint "
        r"response\(s\) of item 0\.\)",
    ):
        check_task(length_ratio_dataset(), None, fragile, num_items=1)


def test_check_task_reports_binding_and_dataset_problems_together() -> None:
    with pytest.raises(TaskCheckError) as info:
        check_task(Dataset.from_dict({"prompt": []}), None, lambda c1, c2, c3: [0.0])
    problems = info.value.report.problems
    assert problems[0].startswith("binding the task: TypeError: reward_func ")
    assert "<lambda> takes 3 positional completion parameter(s)" in problems[0]
    assert problems[1] == (
        "reading the dataset: ValueError: dataset is empty (0 rows); give at least one task item."
    )


def test_check_task_reports_a_bad_threshold_as_a_binding_problem() -> None:
    with pytest.raises(
        TaskCheckError,
        match=r"binding the task: TypeError: "
        r"early_termination_threshold must be a real number",
    ):
        check_task(
            feedback_dataset(),
            None,
            feedback_ratio_reward,
            num_turns=2,
            external_transition=length_feedback,
            early_termination_threshold="0.9",
        )


def test_check_task_reports_a_transition_returning_too_few_prompts() -> None:
    with pytest.raises(
        TaskCheckError,
        match=r"external_transition .*<lambda> returned 1 "
        r"prompt\(s\) for item 0; it must return a list of 2",
    ):
        check_task(
            feedback_dataset(),
            None,
            feedback_ratio_reward,
            num_turns=2,
            external_transition=lambda prompt, agent_completions, num_agents: [prompt],
            num_items=1,
        )


def test_check_task_warns_about_rewards_that_look_unintended() -> None:
    batch_sizes = []

    def batch_relative(c1: list[str], c2: list[str]) -> list[float]:
        batch_sizes.append(len(c1))
        mean = sum(len(a) for a in c1) / len(c1)
        return [len(a) - mean for a in c1]

    report = check_task(feedback_dataset(), None, batch_relative, num_items=1)
    assert report.ok and batch_sizes == [6, 6, 1, 1, 1, 1, 1, 1]
    assert "scores joint responses differently alone" in report.warnings[0]

    def constant(c1: list[str], c2: list[str]) -> list[float]:
        return [0.5] * len(c1)

    name = "test_check_task_warns_about_rewards_that_look_unintended.<locals>.constant"
    report = check_task(
        feedback_dataset(), None, constant, num_items=1, sample_completions=["a", "b"]
    )
    assert report.warnings == (
        f"item 0: reward_func {name} gave 0.5 to every sample joint response; check that it "
        "reads the completions.",
    )


def test_a_reward_constant_on_the_generic_samples_gets_one_warning_that_says_why() -> None:
    # A reward that credits only on-task answers (as the shipped code and writing rewards do)
    def on_task(c1: list[str], c2: list[str]) -> list[float]:
        return [float(a.startswith("def ")) for a in c1]

    report = check_task(feedback_dataset(), None, on_task, num_items=3)
    name = "test_a_reward_constant_on_the_generic_samples_gets_one_warning_that_says_why.<locals>"
    assert report.warnings == (
        f"items 0, 1, 2: reward_func {name}.on_task gave 0.0 to every sample joint response. "
        "The samples are check_task's generic ones (empty, short, non-ASCII and random text), "
        "not answers to the task: a reward that only credits real attempts (tests that pass, a "
        "length band) gives them all one value, and then this is expected. If it should tell "
        "them apart, check that it reads the completions; sample_completions=[...] checks it "
        "on answers of your own.",
    )


def test_check_task_uses_the_given_sample_completions() -> None:
    seen: list[tuple[list[str], list[str]]] = []

    def reward(c1: list[str], c2: list[str]) -> list[float]:
        seen.append((c1, c2))
        return [float(len(b) > len(a)) for a, b in zip(c1, c2, strict=True)]

    check_task(feedback_dataset(), None, reward, num_items=1, sample_completions=["a", "bb", "c"])
    assert seen[0] == (["a", "bb", "c"], ["bb", "c", "a"])  # rotated across agents
    seen.clear()
    check_task(
        feedback_dataset(), None, reward, num_items=1, sample_completions=[["x", "y"], ["xx", ""]]
    )
    assert seen[0] == (["x", "y"], ["xx", ""])  # one list per agent, aligned


@pytest.mark.parametrize(
    "samples, error, message",
    [
        ("abc", TypeError, r"sample_completions must be a non-empty list of str"),
        ([], TypeError, r"sample_completions must be a non-empty list of str"),
        ([["a"], ["b", "c"]], ValueError, r"needs 2 non-empty lists of str of equal length"),
        ([["a"], ["b"], ["c"]], ValueError, r"needs 2 non-empty lists"),
        (["a", ["b"]], TypeError, r"sample_completions mixes strings and lists"),
    ],
)
def test_check_task_rejects_bad_sample_completions(samples: Any, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        check_task(feedback_dataset(), None, feedback_ratio_reward, sample_completions=samples)


def test_check_task_rejects_a_bad_num_items() -> None:
    with pytest.raises(ValueError, match=r"num_items must be an int >= 1, got 0"):
        check_task(feedback_dataset(), None, feedback_ratio_reward, num_items=0)


def test_check_task_reads_a_stream_and_stops_at_its_end() -> None:
    stream = Dataset.from_dict({"prompt": ["a", "b"]}).to_iterable_dataset()
    report = check_task(stream, None, lambda c1, c2: [math.tanh(len(a)) for a in c1], num_items=5)
    assert [line for line in report.checked if "prompts" in line] == [
        "item 0: prompts of [1, 1] characters",
        "item 1: prompts of [1, 1] characters",
    ]
