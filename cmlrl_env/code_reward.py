"""The level-based code reward of the MAGRPO paper's coding tasks, on sandboxed test runs.

A helper agent writes ``aux``; a main agent writes the problem's entry point, which should call
``aux``. ``score_code`` grades one joint answer in gated levels (a later level counts only when
the earlier gates hold):

=====  ===========================================================  ======
level  what                                                         reward
=====  ===========================================================  ======
1      the helper's code parses and defines ``aux``                  0.4
2      the main code parses and defines the entry point              0.6
3      problem context + helper + main compile together              0.5
4      fraction of the problem's tests that pass (sandboxed run)     1.5 × f
5      main calls ``aux`` (0.5) and uses its result (0.5); only      1.0
       when at least one test passes, main binds ``aux`` nowhere
       and binds its entry point only by its one definition
=====  ===========================================================  ======

The maximum is ``CODE_REWARD_MAX = 4.0``, and no reward exceeds it; a failed gate (levels 1–3)
stops there. Tests are the statements of the problem's ``check(candidate)``: each statement that
contains an ``assert`` is one test.

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

import functools
import logging
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cmlrl_env.code_static import (
    HELPER_NAME,
    aux_usage,
    bound_names,
    count_tests,
    extract_code,
    parse,
    split_single_program,
    test_plan,
    top_functions,
)
from cmlrl_env.sandbox import Checker, RunResult, SandboxLimits, run_programs

__all__ = [
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
LEVEL_WEIGHTS = {"aux_defined": 0.4, "main_defined": 0.6, "compiles": 0.5}
TESTS_WEIGHT = 1.5
CALLS_AUX_WEIGHT = 0.5
USES_AUX_RESULT_WEIGHT = 0.5
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
    calls_aux: bool = False
    uses_result: bool = False
    bonus_forfeit: str = ""


def _forfeit(main_code: str, entry: str) -> str:
    """Why the main code gets no cooperation bonus whatever it calls ('' when it may)."""
    names = bound_names(parse(main_code))
    if names[HELPER_NAME]:
        return f"main redefines {HELPER_NAME} (binds the name itself) instead of using the helper's"
    if names[entry] > 1:
        return f"main binds {entry} more than once, so what runs may not be what calls aux"
    return ""


def _static(problem: CodeProblem, helper: str, main: str) -> _Static:
    levels: dict[str, float] = {}
    helper_code, main_code = extract_code(helper), extract_code(main)
    if HELPER_NAME in top_functions(parse(helper_code)):
        levels["aux_defined"] = LEVEL_WEIGHTS["aux_defined"]
    main_funcs = top_functions(parse(main_code))
    if problem.entry_point in main_funcs:
        levels["main_defined"] = LEVEL_WEIGHTS["main_defined"]
    if len(levels) < 2:
        missing = [
            n
            for n, k in ((HELPER_NAME, "aux_defined"), (problem.entry_point, "main_defined"))
            if k not in levels
        ]
        return _Static(levels, f"not defined (or not parsable): {', '.join(missing)}", None)
    source = f"{problem.context}\n{helper_code}\n\n{main_code}\n"
    try:
        compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return _Static(levels, f"the combined program does not compile: {exc}", None)
    levels["compiles"] = LEVEL_WEIGHTS["compiles"]
    calls, uses = aux_usage(main_funcs[problem.entry_point])
    return _Static(levels, "", source, calls, uses, _forfeit(main_code, problem.entry_point))


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
    levels["tests"] = TESTS_WEIGHT * (passed / total if total else 0.0)
    if passed and not static.bonus_forfeit:
        levels["calls_aux"] = CALLS_AUX_WEIGHT * static.calls_aux
        levels["uses_aux_result"] = USES_AUX_RESULT_WEIGHT * static.uses_result
    reason = "; ".join(diagnostics[:3])
    if static.bonus_forfeit:
        reason = f"{static.bonus_forfeit}; {reason}"
    elif passed and not static.calls_aux:
        reason = f"main does not call {HELPER_NAME}; {reason}"
    return CodeScore(levels, passed, total, tuple(diagnostics), reason.strip("; "))


def score_batch(
    problem: CodeProblem,
    helpers: Sequence[str],
    mains: Sequence[str],
    limits: SandboxLimits = DEFAULT_LIMITS,
    test_timeout_s: float = 3.0,
) -> list[CodeScore]:
    """``score_code`` for aligned lists of helper and main completions, the programs run in
    parallel; identical answers are graded once (results are kept in a small cache)."""
    statics = [_static(problem, h, m) for h, m in zip(helpers, mains, strict=True)]
    keys = [(problem, s.program, limits, test_timeout_s) for s in statics]
    todo = {
        k: s
        for k, s in zip(keys, statics, strict=True)
        if s.program is not None and k not in _CACHE
    }
    programs = [_program(problem, s.program or "") for s in todo.values()]
    checkers = [_checker(problem, test_timeout_s)] * len(programs)
    results = run_programs(programs, limits, checkers=checkers)
    fresh = {}
    for (key, static), result in zip(todo.items(), results, strict=True):
        fresh[key] = _dynamic(problem, static, result)
        _CACHE.put(key, fresh[key])
    scores = []
    for key, static in zip(keys, statics, strict=True):
        if static.program is None:
            total = count_tests(problem.test)
            score = CodeScore(dict(static.levels), 0, total, (static.reason,), static.reason)
        else:
            score = fresh[key] if key in fresh else _CACHE.get(key)
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


_ScoreKey = tuple[CodeProblem, str | None, SandboxLimits, float]
"""The problem, the program (None: it did not compile), the limits and the test timeout."""


class _ScoreCache:
    """The last ``size`` graded answers: the multi-turn feedback reuses the reward's runs."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._data: OrderedDict[_ScoreKey, CodeScore] = OrderedDict()

    def __contains__(self, key: _ScoreKey) -> bool:
        return key in self._data

    def get(self, key: _ScoreKey) -> CodeScore:
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key: _ScoreKey, score: CodeScore) -> None:
        self._data[key] = score
        while len(self._data) > self.size:
            self._data.popitem(last=False)


_CACHE = _ScoreCache()
