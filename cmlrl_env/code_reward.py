"""The level-based code reward of the MAGRPO paper's coding tasks, on sandboxed test runs.

A helper agent writes ``aux``; a main agent writes the problem's entry point, which should call
``aux``. ``score_code`` grades one joint answer in gated levels, by the rules of the MAGRPO
paper's published reward (OpenMLRL ``LLM_Collab_Code_Generation``, ``execution_reward_aux``):

=====  ==============================================================  ========
level  what                                                            reward
=====  ==============================================================  ========
1      the helper's code defines ``aux`` with a ``return`` (optional:    0.4
       the reward goes on without it)
1      the main code defines the entry point with a ``return``; else     0.6
       the reward stops
2      problem context + helper + main compile together; else stop       0.5
3      the fraction of the problem's tests that pass (sandboxed run);    1.0 × f
       no tests: stop
bonus  only when a test passed and the helper defines ``aux``, main      0.5
       binds ``aux`` nowhere and its entry point only by its one
       definition: main calls ``aux``
       ... and main is not a bare wrapper (``return aux(...)``, or       1.0
       ``r = aux(...)`` then ``return r``)
       ... and a call of ``aux`` is a bare statement (result dropped)    −0.5
=====  ==============================================================  ========

The maximum is ``CODE_REWARD_MAX = 4.0``: a main that only forwards a correct helper's result
scores 3.0, one that builds on it 4.0. Tests are the statements of the problem's
``check(candidate)`` that hold an ``assert`` and call ``candidate`` (so ``assert True`` is not
one); after three of them time out, the rest are not run. The helper's code joins the program
only when it parses. docs/tasks.md lists what differs from the paper's code, and why.

The tests never run in the program's process. The program (context, helper and main, served by
``_code_server``) runs in ``cmlrl_env.sandbox``; the trusted checker (``_code_checker``) runs in
the sandbox's launcher with its own interpreter, its own builtins and its own copy of the
prompt's code (``poly``, ``encode_cyclic``, ...). It executes ``check`` with ``candidate``
standing for the entry point: each call sends its arguments across a pipe, and the answer comes
back as plain data (JSON of built-in values, ``_code_wire``); an answer that is not plain data
fails its test with the reason. So nothing the program does to its own interpreter reaches the
comparisons, the expected values or the count: each test is counted once, by its position in
the checker. A test fails when the program raises, times out (a per-call alarm in the program,
and the checker's own one a little later), or ends; tests after a program that ended or stopped
answering fail without running. Every reward below the maximum is logged (logger
``cmlrl_env.code_reward``, level INFO) with its reason.
"""

from __future__ import annotations

import ast
import functools
import logging
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cmlrl_env.code_static import (
    HELPER_NAME,
    Function,
    aux_usage,
    bound_names,
    count_tests,
    extract_code,
    has_return,
    is_wrapper,
    parse,
    split_single_program,
    test_plan,
    top_functions,
)
from cmlrl_env.sandbox import Checker, RunResult, SandboxLimits, run_programs

__all__ = [
    "CODE_LEVELS",
    "CODE_REWARD_MAX",
    "DEFAULT_LIMITS",
    "CodeProblem",
    "CodeScore",
    "count_tests",
    "extract_code",
    "score_code",
    "score_batch",
    "split_single_program",
]

LOG = logging.getLogger(__name__)
CODE_REWARD_MAX = 4.0
LEVEL_WEIGHTS = {
    "aux_defined": 0.4,
    "main_defined": 0.6,
    "compiles": 0.5,
    "tests": 1.0,
    "uses_aux": 0.5,
    "not_wrapper": 1.0,
    "discarded_aux_result": -0.5,
}
CODE_LEVELS = tuple(LEVEL_WEIGHTS)
DEFAULT_LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=10, memory_mb=1024, max_processes=1)
"""One process per program (no fork, no threads): its memory limit is the run's on any machine."""
_HERE = Path(__file__).parent


@dataclass(frozen=True)
class CodeProblem:
    """What the reward needs of a problem: its id, prompt, entry point and test code."""

    task_id: str
    prompt: str
    entry_point: str
    test: str

    @property
    def context(self) -> str:
        """The prompt's code before the entry point's ``def``: imports and given helpers."""
        match = re.search(rf"^def {re.escape(self.entry_point)}\s*\(", self.prompt, re.M)
        return self.prompt[: match.start()] if match else ""


@dataclass(frozen=True)
class CodeScore:
    """The levels of one joint answer; ``reward`` is their sum, ``reason`` why it stopped."""

    levels: dict[str, float]
    tests_passed: int
    tests_total: int
    diagnostics: tuple[str, ...] = field(default=())
    reason: str = ""

    @property
    def reward(self) -> float:
        return min(float(sum(self.levels.values())), CODE_REWARD_MAX)

    @property
    def pass_rate(self) -> float:
        return self.tests_passed / self.tests_total if self.tests_total else 0.0

    @property
    def passed_all(self) -> bool:
        return self.tests_total > 0 and self.tests_passed == self.tests_total


@dataclass(frozen=True)
class _Static:
    """What can be judged without running: the gates, and the program if they hold."""

    levels: dict[str, float]
    reason: str
    program: str | None
    bonus: dict[str, float] = field(default_factory=dict)
    """The cooperation levels, earned only when a test passes."""
    bonus_forfeit: str = ""


def _forfeit(helper_defines_aux: bool, main_tree: ast.Module | None, entry: str) -> str:
    """Why the team gets no cooperation bonus whatever main calls ('' when it may)."""
    if not helper_defines_aux:
        return f"the helper defines no {HELPER_NAME}"
    names = bound_names(main_tree)
    if names[HELPER_NAME]:
        return f"main redefines {HELPER_NAME} (binds the name itself) instead of using the helper's"
    if names[entry] > 1:
        return f"main binds {entry} more than once, so what runs may not be what calls aux"
    return ""


def _bonus(main: Function) -> dict[str, float]:
    calls, discards = aux_usage(main)
    if not calls:
        return {}
    bonus = {"uses_aux": LEVEL_WEIGHTS["uses_aux"]}
    if not is_wrapper(main):
        bonus["not_wrapper"] = LEVEL_WEIGHTS["not_wrapper"]
    if discards:
        bonus["discarded_aux_result"] = LEVEL_WEIGHTS["discarded_aux_result"]
    return bonus


def _static(problem: CodeProblem, helper: str, main: str) -> _Static:
    levels: dict[str, float] = {}
    helper_code, main_code = extract_code(helper), extract_code(main)
    helper_tree = parse(helper_code)
    aux = top_functions(helper_tree).get(HELPER_NAME)
    if aux is not None and has_return(aux):
        levels["aux_defined"] = LEVEL_WEIGHTS["aux_defined"]
    main_tree = parse(main_code)
    entry = top_functions(main_tree).get(problem.entry_point)
    if entry is None or not has_return(entry):
        what = "does not define" if entry is None else "has no return in"
        reason = f"the main code {what} {problem.entry_point} (or does not parse)"
        return _Static(levels, reason, None)
    levels["main_defined"] = LEVEL_WEIGHTS["main_defined"]
    joined = helper_code if helper_tree is not None else ""  # aux is optional, so is its code
    source = f"{problem.context}\n{joined}\n\n{main_code}\n"
    try:
        compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return _Static(levels, f"the combined program does not compile: {exc}", None)
    levels["compiles"] = LEVEL_WEIGHTS["compiles"]
    if not count_tests(problem.test):
        return _Static(levels, "the problem has no tests that call candidate", None)
    forfeit = _forfeit(aux is not None, main_tree, problem.entry_point)
    return _Static(levels, "", source, _bonus(entry), forfeit)


@functools.lru_cache(maxsize=1)
def _texts() -> dict[str, str]:
    names = ("_code_wire", "_code_server", "_code_checker")
    return {n: (_HERE / f"{n}.py").read_text() for n in names}


def _program(problem: CodeProblem, source: str) -> str:
    """The program the sandbox runs: the wire format, the server, and the solution to serve."""
    texts = _texts()
    call = f"serve({source!r}, {problem.entry_point!r}, encode, decode)\n"
    return f"{texts['_code_wire']}\n{texts['_code_server']}\n{call}"


@functools.lru_cache(maxsize=256)
def _checker(problem: CodeProblem, test_timeout_s: float) -> Checker:
    setup, statements = test_plan(problem.test)
    texts = _texts()
    modules = tuple((f"cmlrl_env.{n}", texts[n]) for n in ("_code_wire", "_code_checker"))
    payload = {
        "setup": [problem.context, *setup],
        "statements": [list(s) for s in statements],
        "entry": problem.entry_point,
        "timeout": test_timeout_s,
    }
    return Checker(modules, payload)


def _outcomes(problem: CodeProblem, result: RunResult) -> tuple[list[str | None], list[str]]:
    """(per test: None when it passed, else why not; the run's own diagnostics)."""
    total = count_tests(problem.test)
    report = result.report if isinstance(result.report, dict) else {}
    tests = report.get("tests")
    if not isinstance(tests, list) or len(tests) != total:
        reason = report.get("checker_error") or f"the program did not finish: {result.reason}"
        LOG.warning("%s: no test results: %s", problem.task_id, reason)
        return [f"not run: {reason}"] * total, [str(reason)]
    notes = [f"loading failed: {report['load_error']}"] if report.get("load_error") else []
    if report.get("stopped"):
        notes.append(f"the program did not finish: {report['stopped']}; {result.reason}")
    return tests, notes


def _dynamic(problem: CodeProblem, static: _Static, result: RunResult) -> CodeScore:
    outcomes, notes = _outcomes(problem, result)
    sources = [s for is_test, s in test_plan(problem.test)[1] if is_test]
    passed = sum(error is None for error in outcomes)
    diagnostics = [
        f"{error}: {source[:300]}"
        for error, source in zip(outcomes, sources, strict=True)
        if error is not None and not str(error).startswith("not run")
    ] + notes
    total = len(outcomes)
    levels = dict(static.levels)
    levels["tests"] = LEVEL_WEIGHTS["tests"] * passed / total
    if passed and not static.bonus_forfeit:
        levels.update(static.bonus)
    reason = "; ".join(diagnostics[:3])
    if passed and static.bonus_forfeit:
        reason = f"{static.bonus_forfeit}; {reason}"
    elif passed and not static.bonus:
        reason = f"main does not call {HELPER_NAME}; {reason}"
    elif passed and "not_wrapper" not in static.bonus:
        reason = f"main only forwards {HELPER_NAME}'s result; {reason}"
    return CodeScore(levels, passed, total, tuple(diagnostics), reason.strip("; "))


def score_batch(
    problem: CodeProblem,
    helpers: Sequence[str],
    mains: Sequence[str],
    limits: SandboxLimits = DEFAULT_LIMITS,
    test_timeout_s: float = 3.0,
) -> list[CodeScore]:
    """``score_code`` for aligned lists of helper and main completions, the programs run in
    parallel; a program is run once (its run is kept in a small cache), and each answer is
    graded on its own split of it into helper and main (the bonus depends on that split)."""
    statics = [_static(problem, h, m) for h, m in zip(helpers, mains, strict=True)]
    keys = [(problem, s.program, limits, test_timeout_s) for s in statics]
    runs = {k: _CACHE.get(k) for k, s in zip(keys, statics, strict=True) if k in _CACHE}
    todo = {
        k: s.program
        for k, s in zip(keys, statics, strict=True)
        if s.program is not None and k not in runs
    }
    programs = [_program(problem, program) for program in todo.values()]
    checkers = [_checker(problem, test_timeout_s)] * len(programs)
    for key, result in zip(todo, run_programs(programs, limits, checkers=checkers), strict=True):
        runs[key] = result
        _CACHE.put(key, result)
    scores = []
    for key, static in zip(keys, statics, strict=True):
        if static.program is None:
            total = count_tests(problem.test)
            score = CodeScore(dict(static.levels), 0, total, (static.reason,), static.reason)
        else:
            score = _dynamic(problem, static, runs[key])
        if score.reward < CODE_REWARD_MAX:
            LOG.info(
                "%s: reward %.3g of %.1f: %s",
                problem.task_id,
                score.reward,
                CODE_REWARD_MAX,
                score.reason,
            )
        scores.append(score)
    return scores


def score_code(
    problem: CodeProblem,
    helper: str,
    main: str,
    limits: SandboxLimits = DEFAULT_LIMITS,
    test_timeout_s: float = 3.0,
) -> CodeScore:
    """Grade one joint answer (helper completion, main completion); see the module docstring."""
    return score_batch(problem, [helper], [main], limits, test_timeout_s)[0]


_RunKey = tuple[CodeProblem, str | None, SandboxLimits, float]
"""The problem, the program (None: it did not compile), the limits and the test timeout."""


class _RunCache:
    """The last ``size`` programs' runs: the multi-turn feedback reuses the reward's runs."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._data: OrderedDict[_RunKey, RunResult] = OrderedDict()

    def __contains__(self, key: _RunKey) -> bool:
        return key in self._data

    def get(self, key: _RunKey) -> RunResult:
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key: _RunKey, result: RunResult) -> None:
        self._data[key] = result
        while len(self._data) > self.size:
            self._data.popitem(last=False)


_CACHE = _RunCache()
