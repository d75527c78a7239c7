"""The shipped anti-cheat suite: the code reward against model-written tricks.

Every trick of ``cheats.TRICKS`` goes through the public reward on each path that grades code
(two agents, one model, the multi-turn feedback, the evaluation logger) and must score no more
than the honest answer it stands beside: a wrong answer that calls ``aux`` (1.5), a correct one
that ignores the helper (2.5), or one that answers 0.5 to every call. Before the tests moved out
of the program's process, most of them scored 3.5 to 27.5.
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from cheats import HONEST, TRICKS

from cmlrl_env.code_metrics import code_eval_logger
from cmlrl_env.code_reward import CODE_REWARD_MAX, CodeScore, _dynamic, _Static, score_code
from cmlrl_env.code_tasks import (
    code_feedback,
    humaneval_dataset,
    humaneval_reward,
    humaneval_single_reward,
    problem_of,
)
from cmlrl_env.sandbox import RunResult

ITEMS = {t: humaneval_dataset([t])[0] for t in ("HumanEval/2", "HumanEval/32")}
HONEST_REWARDS = {
    ("wrong", "HumanEval/2"): 1.5,  # the static levels: no test passes, no bonus
    ("wrong", "HumanEval/32"): 1.5,
    ("no_aux", "HumanEval/2"): 2.5,  # every test passes, no cooperation bonus
    # 0.5 passes 1 of 3 tests; main calls aux, keeps its result and is not a bare wrapper
    ("constant", "HumanEval/2"): 1.5 + 1 / 3 + 0.5 + 1.0,
}


def _by_task() -> dict[str, list[str]]:
    names = defaultdict(list)
    for name, (task, *_) in TRICKS.items():
        names[task].append(name)
    return names


@pytest.fixture(scope="module")
def two_agents() -> dict[str, float]:
    rewards = {}
    for task, names in _by_task().items():
        helpers = [TRICKS[n][1] for n in names]
        mains = [TRICKS[n][2] for n in names]
        found = humaneval_reward(helpers, mains, batch_items=[ITEMS[task]])
        rewards.update(zip(names, found, strict=True))
    for kind, answers in HONEST.items():
        for task, (helper, main) in answers.items():
            (rewards[f"{kind} {task}"],) = humaneval_reward(
                [helper], [main], batch_items=[ITEMS[task]]
            )
    return rewards


@pytest.fixture(scope="module")
def one_model() -> dict[str, float]:
    rewards = {}
    for task, names in _by_task().items():
        programs = [f"{TRICKS[n][1]}\n\n{TRICKS[n][2]}" for n in names]
        found = humaneval_single_reward(programs, batch_items=[ITEMS[task]])
        rewards.update(zip(names, found, strict=True))
    for kind, answers in HONEST.items():
        for task, (helper, main) in answers.items():
            program = [f"{helper}\n\n{main}"]
            (rewards[f"{kind} {task}"],) = humaneval_single_reward(
                program, batch_items=[ITEMS[task]]
            )
    return rewards


def test_the_honest_answers_score_what_the_levels_say(two_agents, one_model) -> None:
    for (kind, task), reward in HONEST_REWARDS.items():
        assert two_agents[f"{kind} {task}"] == pytest.approx(reward), (kind, task)
        assert one_model[f"{kind} {task}"] == pytest.approx(reward), (kind, task)


@pytest.mark.parametrize("name", list(TRICKS))
def test_a_trick_scores_no_more_than_the_honest_answer(two_agents, one_model, name) -> None:
    task, _, _, kind = TRICKS[name]
    assert two_agents[name] <= two_agents[f"{kind} {task}"] + 1e-9
    assert one_model[name] <= one_model[f"{kind} {task}"] + 1e-9


def shown_score(prompt: str) -> float:
    return float(re.search(r"Score ([\d.]+) of 4\.0", prompt).group(1))


@pytest.mark.parametrize("name", list(TRICKS))
def test_a_trick_gains_nothing_in_the_feedback_or_the_evaluation(
    two_agents, one_model, name
) -> None:
    task, helper, main, kind = TRICKS[name]
    honest = f"{kind} {task}"
    prompt = ITEMS[task]["prompt"]
    assert shown_score(code_feedback(prompt, [helper, main], 2)[1]) <= round(two_agents[honest], 2)
    program = f"{helper}\n\n{main}"
    assert shown_score(code_feedback(prompt, [program], 1)[0]) <= round(one_model[honest], 2)
    (row,) = code_eval_logger(
        agent_completions_turns=[[[helper]], [[main]]], batch_items=[ITEMS[task]], prompts=None
    )
    assert row["turn_1/reward"] <= two_agents[f"{kind} {task}"] + 1e-9


def test_the_equal_to_everything_answer_fails_with_a_clear_reason() -> None:
    task, helper, main, _ = TRICKS["returns an object equal to everything"]
    score = score_code(problem_of({"task_id": task}), helper, main)
    assert (score.tests_passed, score.tests_total) == (0, 3)
    assert score.diagnostics[0] == (
        "the answer cannot be sent back: a Anything is not plain data: assert candidate(3.5) == 0.5"
    )


def test_a_score_never_exceeds_the_maximum() -> None:
    levels = {"aux_defined": 0.4, "main_defined": 0.6, "compiles": 0.5, "tests": 25.0}
    assert CodeScore(levels, 50, 3).reward == CODE_REWARD_MAX


def test_a_report_that_does_not_match_the_tests_counts_no_test() -> None:
    # Three tests but four results (or none): nothing passes, whatever the entries say.
    problem = problem_of({"task_id": "HumanEval/2"})
    static = _Static({"aux_defined": 0.4, "main_defined": 0.6, "compiles": 0.5}, "", "", True, True)
    for report in ({"tests": [None] * 4}, {"tests": None}, None, [None, None, None]):
        result = RunResult("ok", 0, "", "", 0.1, True, report)
        score = _dynamic(problem, static, result)
        assert (score.tests_passed, score.tests_total, score.reward) == (0, 3, 1.5)
