"""pass@k against hand-worked values; the eval hooks and the multi-turn feedback on HumanEval."""

from __future__ import annotations

import pytest

from cmlrl_env.code_metrics import code_eval_aggregator, code_eval_logger, pass_at_k, pass_at_k_mean
from cmlrl_env.code_tasks import code_feedback, humaneval_dataset, humaneval_problems

PROMPT0 = humaneval_problems()["HumanEval/0"]["prompt"]
GOOD_AUX = (
    "def aux(numbers, threshold):\n" + humaneval_problems()["HumanEval/0"]["canonical_solution"]
)
CALLING_MAIN = (
    "def has_close_elements(numbers, threshold):\n    result = aux(numbers, threshold)\n"
    "    return result\n"
)
TRUE_AUX = "def aux(numbers, threshold):\n    return True\n"


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
        (10, 0, 3, 0.0),
        (3, 2, 2, 1.0),  # n - c < k: every draw of 2 holds a pass
        (20, 20, 10, 1.0),
    ],
)
def test_pass_at_k_matches_hand_worked_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_pass_at_k_mean_and_bad_arguments() -> None:
    assert pass_at_k_mean([(4, 1), (5, 2)], 1) == pytest.approx((0.25 + 0.4) / 2)
    with pytest.raises(ValueError, match="1 <= k <= n and c <= n, got n=3, c=1, k=4"):
        pass_at_k(3, 1, 4)
    with pytest.raises(ValueError, match="c must be an int >= 0, got -1"):
        pass_at_k(3, -1, 1)


def test_eval_hooks_give_pass_at_1_pass_rate_and_levels_per_turn() -> None:
    items = list(humaneval_dataset(["HumanEval/0", "HumanEval/0"]))
    completions = [
        [[GOOD_AUX, GOOD_AUX], [TRUE_AUX]],  # helper: item 0 has two turns, item 1 ended at one
        [[CALLING_MAIN, CALLING_MAIN], [CALLING_MAIN]],
    ]
    rows = code_eval_logger(agent_completions_turns=completions, batch_items=items, prompts=None)
    assert rows[0]["turn_1/passed"] == 1.0 and rows[1]["turn_1/test_pass_rate"] == 4 / 7
    assert "turn_2/passed" not in rows[1]
    metrics = code_eval_aggregator(rows, num_turns=2)
    assert metrics["turn_1/pass@1"] == 0.5
    assert metrics["turn_1/test_pass_rate"] == pytest.approx((1 + 4 / 7) / 2)
    # Both mains only forward aux's result (no 1.0): 1.5 + 1.0 + 0.5, and 1.5 + 4 / 7 + 0.5.
    assert metrics["turn_1/reward"] == pytest.approx((3.0 + 2.0 + 4 / 7) / 2)
    assert metrics["turn_1/level/tests"] == pytest.approx((1 + 4 / 7) / 2)
    assert metrics["turn_1/level/uses_aux"] == 0.5 and metrics["turn_1/level/not_wrapper"] == 0
    assert metrics["turn_2/pass@1"] == 1.0  # only item 0 played turn 2


def test_feedback_reports_failing_asserts_and_shows_both_codes() -> None:
    helper_prompt, main_prompt = code_feedback(PROMPT0, [TRUE_AUX, CALLING_MAIN], 2)
    for prompt in (helper_prompt, main_prompt):
        assert PROMPT0 in prompt and TRUE_AUX.strip() in prompt and CALLING_MAIN.strip() in prompt
        assert "tests passed: 4 of 7" in prompt
        assert (
            "- assert failed: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False"
            in prompt
        )
    assert helper_prompt.endswith(
        "Write an improved `aux`. Answer with one Python code block and nothing else."
    )
    assert "Write an improved `has_close_elements`." in main_prompt


def test_feedback_reports_syntax_errors_and_missing_functions() -> None:
    broken_main = "def has_close_elements(numbers, threshold):\n    return aux(numbers\n"
    helper_prompt, _ = code_feedback(PROMPT0, [TRUE_AUX, broken_main], 2)
    assert "- the main code does not define has_close_elements (or does not parse)" in helper_prompt
    compile_error = "def has_close_elements(numbers, threshold):\n    return 1\nreturn 2\n"
    helper_prompt, _ = code_feedback(PROMPT0, [TRUE_AUX, compile_error], 2)
    assert "the combined program does not compile: 'return' outside function" in helper_prompt


def test_feedback_reports_a_timeout() -> None:
    # Hangs on the first test only: the per-test alarm (3 s) ends it, the other tests still run.
    hangs_once = (
        "def has_close_elements(numbers, threshold):\n    while threshold == 0.3:\n"
        "        pass\n    return True\n"
    )
    helper_prompt, _ = code_feedback(PROMPT0, [TRUE_AUX, hangs_once], 2)
    assert "tests passed: 3 of 7" in helper_prompt
    assert (
        "- timeout: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True" in helper_prompt
    )


def test_feedback_for_one_agent_and_for_prompts_without_tests() -> None:
    (prompt,) = code_feedback(PROMPT0, [GOOD_AUX + "\n\n" + CALLING_MAIN], 1)
    assert "Score 3.00 of 4.0; tests passed: 7 of 7." in prompt
    (prompt,) = code_feedback("Write a function.", ["def main(): pass"], 1)
    assert "No tests are known for this problem" in prompt
    with pytest.raises(ValueError, match="serves 1 or 2 agents"):
        code_feedback(PROMPT0, ["a", "b", "c"], 3)


def test_a_custom_items_tests_reach_the_turn_two_prompts_through_the_env() -> None:
    # The env hands the transition the whole item, whose own entry point and tests the reward
    # used at turn 1: turn 2 reports them and asks for the same function.
    from datasets import Dataset

    from cmlrl_env import CoMLRLEnv
    from cmlrl_env.code_tasks import helper_formatter, humaneval_reward, main_formatter

    item = {
        "task_id": "custom/add",
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "entry_point": "add",
        "test": (
            "def check(candidate):\n    assert candidate(1, 2) == 3\n"
            "    assert candidate(2, 2) == 4\n"
        ),
    }
    env = CoMLRLEnv(
        Dataset.from_list([item]),
        [helper_formatter, main_formatter],
        humaneval_reward,
        num_turns=2,
        external_transition=code_feedback,
        early_termination_threshold=None,
    )
    env.reset(seed=0)
    helper = "def aux(a, b):\n    return a - b\n"
    main = "def add(a, b):\n    return aux(a, b) + 0\n"
    observations, *_ = env.step({"agent_0": helper, "agent_1": main})
    assert "tests passed: 0 of 2" in observations["agent_1"]
    assert "Write an improved `add`" in observations["agent_1"]
