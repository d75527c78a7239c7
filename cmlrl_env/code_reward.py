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
       when at least one test passes and main does not redefine
       ``aux`` itself
=====  ===========================================================  ======

The maximum is ``CODE_REWARD_MAX = 4.0``; a failed gate (levels 1–3) stops there. Tests are the
statements of the problem's ``check(candidate)``: each statement that contains an ``assert`` is
one test. The program runs in ``cmlrl_env.sandbox`` with a per-test alarm inside and the
sandbox's limits outside; tests that never report (a timeout, a crash, a killed process) count as
failed. Every reward below the maximum is logged (logger ``cmlrl_env.code_reward``, level INFO)
with its reason.

Integrity: the harness reports results from inside the sandbox, so a program written to forge
them could fake passes; the sandbox protects the host, not the reward from a deliberate cheat.
"""

from __future__ import annotations

import ast
import json
import logging
import re
import secrets
import textwrap
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from cmlrl_env.sandbox import RunResult, SandboxLimits, run_programs

__all__ = [
    "CODE_REWARD_MAX",
    "CodeProblem",
    "CodeScore",
    "extract_code",
    "score_code",
    "score_batch",
    "split_single_program",
]

LOG = logging.getLogger(__name__)
CODE_REWARD_MAX = 4.0
HELPER_NAME = "aux"
LEVEL_WEIGHTS = {"aux_defined": 0.4, "main_defined": 0.6, "compiles": 0.5}
TESTS_WEIGHT = 1.5
CALLS_AUX_WEIGHT = 0.5
USES_AUX_RESULT_WEIGHT = 0.5
DEFAULT_LIMITS = SandboxLimits(wall_time_s=10.0, cpu_time_s=10, memory_mb=1024)
_FENCE = re.compile(r"```[ \t]*(?:python|py|Python)?[ \t]*\n(.*?)(?:```|\Z)", re.S)


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
        return float(sum(self.levels.values()))

    @property
    def pass_rate(self) -> float:
        return self.tests_passed / self.tests_total if self.tests_total else 0.0

    @property
    def passed_all(self) -> bool:
        return self.tests_total > 0 and self.tests_passed == self.tests_total


def extract_code(completion: str) -> str:
    """The first fenced code block of a completion, or the whole completion if it has none."""
    match = _FENCE.search(completion)
    return textwrap.dedent(match.group(1) if match else completion).strip("\n")


def _parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _top_functions(tree: ast.Module | None) -> dict[str, ast.FunctionDef]:
    if tree is None:
        return {}
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def split_single_program(code: str) -> tuple[str, str]:
    """One agent's program as (helper code, main code): the ``aux`` definition, and the rest."""
    tree = _parse(code)
    aux = _top_functions(tree).get(HELPER_NAME)
    if tree is None or aux is None:
        return "", code
    lines = code.splitlines()
    start = (aux.decorator_list[0].lineno if aux.decorator_list else aux.lineno) - 1
    end = aux.end_lineno or aux.lineno
    return "\n".join(lines[start:end]), "\n".join(lines[:start] + lines[end:])


def _aux_usage(main: ast.FunctionDef) -> tuple[bool, bool]:
    """(main calls aux, some call's result is used: not a bare expression statement)."""
    calls = [
        n
        for n in ast.walk(main)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == HELPER_NAME
    ]
    bare = {
        id(n.value)
        for n in ast.walk(main)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
    }
    return bool(calls), any(id(c) not in bare for c in calls)


def count_tests(test: str) -> int:
    """Statements of ``check(candidate)`` that contain an ``assert``."""
    check = _top_functions(_parse(test)).get("check")
    if check is None:
        return 0
    return sum(any(isinstance(n, ast.Assert) for n in ast.walk(s)) for s in check.body)


@dataclass(frozen=True)
class _Static:
    """What can be judged without running: the gates, and the program if they hold."""

    levels: dict[str, float]
    reason: str
    program: str | None
    calls_aux: bool = False
    uses_result: bool = False
    redefines_aux: bool = False


def _static(problem: CodeProblem, helper: str, main: str) -> _Static:
    levels: dict[str, float] = {}
    helper_code, main_code = extract_code(helper), extract_code(main)
    if HELPER_NAME in _top_functions(_parse(helper_code)):
        levels["aux_defined"] = LEVEL_WEIGHTS["aux_defined"]
    main_funcs = _top_functions(_parse(main_code))
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
    calls, uses = _aux_usage(main_funcs[problem.entry_point])
    redefines = HELPER_NAME in main_funcs
    return _Static(levels, "", source, calls, uses, redefines)


_HARNESS = """
import ast as _ast, json as _json, signal as _signal, sys as _sys
_MARK = {mark!r}
def _report(**fields):
    _sys.__stdout__.write(_MARK + _json.dumps(fields) + "\\n")
    _sys.__stdout__.flush()
class _TestTimeout(BaseException):
    pass
def _alarm(signum, frame):
    raise _TestTimeout()
_signal.signal(_signal.SIGALRM, _alarm)
_ns = {{"__name__": "__solution__"}}
try:
    exec(compile({source!r}, "solution.py", "exec"), _ns)
    _tree = _ast.parse({test!r})
    _check = None
    for _node in _tree.body:
        if isinstance(_node, _ast.FunctionDef) and _node.name == "check":
            _check = _node
        else:
            exec(compile(_ast.Module([_node], []), "test.py", "exec"), _ns)
    _ns["candidate"] = _ns[{entry!r}]
except BaseException as _exc:
    _report(event="load_error", error=f"{{type(_exc).__name__}}: {{_exc}}"[:300])
    _sys.exit(0)
_index = 0
for _stmt in _check.body:
    _is_test = any(isinstance(_n, _ast.Assert) for _n in _ast.walk(_stmt))
    _signal.setitimer(_signal.ITIMER_REAL, {test_timeout})
    try:
        exec(compile(_ast.Module([_stmt], []), "test.py", "exec"), _ns)
        _error = None
    except _TestTimeout:
        _error = "timeout"
    except AssertionError:
        _error = "assert failed"
    except BaseException as _exc:
        _error = f"{{type(_exc).__name__}}: {{_exc}}"[:300]
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
    if _is_test:
        _report(event="test", index=_index, error=_error, source=_ast.unparse(_stmt)[:300])
        _index += 1
    elif _error is not None:
        _report(event="setup_error", error=_error)
_report(event="done")
"""


def _program(problem: CodeProblem, source: str, mark: str, test_timeout: float) -> str:
    return _HARNESS.format(
        mark=mark,
        source=source,
        test=problem.test,
        entry=problem.entry_point,
        test_timeout=test_timeout,
    )


def _read_events(result: RunResult, mark: str) -> list[dict]:
    events = []
    for line in result.stdout.splitlines():
        if line.startswith(mark):
            try:
                events.append(json.loads(line[len(mark) :]))
            except ValueError:
                continue
    return events


def _dynamic(problem: CodeProblem, static: _Static, result: RunResult, mark: str) -> CodeScore:
    events = _read_events(result, mark)
    total = count_tests(problem.test)
    tests = [e for e in events if e.get("event") == "test"]
    passed = sum(e.get("error") is None for e in tests)
    diagnostics = [f"{e['error']}: {e.get('source', '')}" for e in tests if e.get("error")]
    diagnostics += [
        f"loading failed: {e['error']}" for e in events if e.get("event") == "load_error"
    ]
    finished = any(e.get("event") == "done" for e in events)
    if not finished and not any(e.get("event") == "load_error" for e in events):
        diagnostics.append(f"the program did not finish: {result.reason}")
    levels = dict(static.levels)
    levels["tests"] = TESTS_WEIGHT * (passed / total if total else 0.0)
    if passed and not static.redefines_aux:
        levels["calls_aux"] = CALLS_AUX_WEIGHT * static.calls_aux
        levels["uses_aux_result"] = USES_AUX_RESULT_WEIGHT * static.uses_result
    reason = "; ".join(diagnostics[:3])
    if static.redefines_aux:
        reason = f"main redefines {HELPER_NAME} instead of using the helper's; " + reason
    elif passed and not static.calls_aux:
        reason = f"main does not call {HELPER_NAME}; " + reason
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
    mark = f"@@cmlrl-{secrets.token_hex(8)}@@"
    programs = [_program(problem, s.program or "", mark, test_timeout_s) for s in todo.values()]
    for (key, static), result in zip(todo.items(), run_programs(programs, limits), strict=True):
        _CACHE.put(key, _dynamic(problem, static, result, mark))
    scores = []
    for key, static in zip(keys, statics, strict=True):
        if static.program is None:
            total = count_tests(problem.test)
            score = CodeScore(dict(static.levels), 0, total, (static.reason,), static.reason)
        else:
            score = _CACHE.get(key)
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


class _ScoreCache:
    """The last ``size`` graded answers: the multi-turn feedback reuses the reward's runs."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._data: OrderedDict[tuple, CodeScore] = OrderedDict()

    def __contains__(self, key: tuple) -> bool:
        return key in self._data

    def get(self, key: tuple) -> CodeScore:
        self._data.move_to_end(key)
        return self._data[key]

    def put(self, key: tuple, score: CodeScore) -> None:
        self._data[key] = score
        while len(self._data) > self.size:
            self._data.popitem(last=False)


_CACHE = _ScoreCache()
