"""The trusted side of a code test (stdlib only): it runs outside the program's process.

The sandbox runs this in its launcher, a process of its own with its own interpreter and
builtins, while the program (``_code_server``) runs in the sandbox. ``run(link, payload,
deadline)`` executes the problem's own code (the prompt's imports and given functions, such as
``poly``) and the test module's top-level statements, waits for the program to load, binds
``candidate`` and the entry point's name to a stand-in whose calls cross the pipe, then executes
the statements of ``check`` one by one. A statement that holds an ``assert`` and calls
``candidate`` is one test, known by its position here (after three tests timed out, the rest
are not run): the result is one entry per test (``None``: passed, else why not),
whatever the program sends. The program only ever sees the arguments of its calls; the expected
values, the comparisons and the report never leave this process.
"""

from __future__ import annotations

import signal
import time

from cmlrl_env._code_wire import NotPlain, decode, encode

TYPE_CHECKING = False  # typing is not imported at run time: the launcher starts for every program
if TYPE_CHECKING:
    from typing import Any

GRACE_S = 0.5
"""How long after a statement's time is up the checker waits for the program's own alarm."""
MAX_TIMEOUTS = 3
"""After this many tests timed out, the rest are not run (they fail), as in the paper's code."""


class _StatementTimeout(BaseException):
    """The checker's alarm: a statement (or the program's answer to it) took too long."""


class ProgramFailed(Exception):
    """The program raised, timed out, or answered with something that is not plain data."""


class ProgramGone(Exception):
    """The program ended or stopped answering: this test fails, and every later one."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _StatementTimeout()


class Candidate:
    """Stands for the entry point in the test code: a call sends its arguments to the program
    and returns the plain value that comes back, or raises ``ProgramFailed``."""

    def __init__(self, link: Any) -> None:
        self._link = link
        self._next_id = 1
        self.deadline = 0.0
        self.waiting = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            request: dict[str, object] = {
                "a": [encode(a) for a in args],
                "k": {k: encode(kwargs[k]) for k in kwargs},
            }
        except NotPlain as exc:
            raise ProgramFailed(f"the test's argument cannot be sent: {exc}") from None
        ident, self._next_id = self._next_id, self._next_id + 1
        request.update(id=ident, t=max(self.deadline - time.monotonic(), 0.0))
        self.waiting = True
        try:
            self._link.send(request)
            reply = self._reply(ident)
        finally:
            self.waiting = False
        if "e" in reply or "v" not in reply:
            raise ProgramFailed(str(reply.get("e", "an answer without a value"))[:300])
        try:
            return decode(reply["v"])
        except (ValueError, TypeError, RecursionError, OverflowError, MemoryError) as exc:
            raise ProgramFailed(f"the answer could not be read: {exc}"[:300]) from None

    def _reply(self, ident: int) -> dict[str, Any]:
        while True:  # an answer to an earlier call that timed out may still come first
            try:
                reply = self._link.receive()
            except EOFError:
                raise ProgramGone("the program ended") from None
            except ValueError as exc:
                message = f"the program sent something that is not an answer: {exc}"
                raise ProgramGone(message) from None
            if type(reply) is dict and reply.get("id") == ident:
                return reply


def _await_load(link: Any, deadline: float) -> str | None:
    """None once the program has loaded its solution, else why it did not."""
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 0.001))
    try:
        reply = link.receive()
    except _StatementTimeout:
        return "the program did not load within the wall-clock limit"
    except EOFError:
        return "the program ended before it loaded"
    except ValueError as exc:
        return f"the program sent something that is not an answer: {exc}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if type(reply) is not dict or reply.get("id") != 0:
        return "the program did not say it had loaded"
    return str(reply["e"])[:300] if "e" in reply else None


def _execute(
    code: Any, namespace: dict[str, Any], candidate: Candidate, link: Any, end: float
) -> tuple[str | None, str | None]:
    """(why the statement failed or None, why the program is gone or None)."""
    candidate.deadline = end
    signal.setitimer(signal.ITIMER_REAL, max(end - time.monotonic(), 0.001) + GRACE_S)
    try:
        exec(code, namespace)
        return None, None
    except AssertionError:
        return "assert failed", None
    except ProgramFailed as exc:
        return str(exc), None
    except ProgramGone as exc:
        return str(exc), str(exc)
    except _StatementTimeout:
        if candidate.waiting:  # the program ignored its own alarm: stop it
            link.stop()
            return "timeout", "the program stopped answering"
        return "timeout", None
    except BaseException as exc:
        return f"{type(exc).__name__}: {exc}"[:300], None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def run(link: Any, payload: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Run the problem's ``check`` against the program behind ``link``; see the module doc."""
    namespace: dict[str, Any] = {"__name__": "__checker__"}
    for source in payload["setup"]:
        exec(compile(source, "test.py", "exec"), namespace)
    statements = [(bool(t), compile(s, "test.py", "exec")) for t, s in payload["statements"]]
    signal.signal(signal.SIGALRM, _on_alarm)
    gone = _await_load(link, deadline)
    report: dict[str, Any] = {"load_error": gone, "tests": [], "setup_errors": []}
    candidate = Candidate(link)
    namespace["candidate"] = namespace[payload["entry"]] = candidate
    timeouts, skip = 0, None
    for is_test, code in statements:
        now = time.monotonic()
        if gone is None and now >= deadline:
            gone = "the run's wall-clock limit passed"
        error: str | None
        if gone is not None or skip is not None:
            error = f"not run: {gone or skip}"
        else:
            end = min(now + payload["timeout"], deadline)
            error, gone = _execute(code, namespace, candidate, link, end)
        if is_test:
            report["tests"].append(error)
            timeouts += error == "timeout"
            if timeouts >= MAX_TIMEOUTS and skip is None:
                skip = f"{MAX_TIMEOUTS} tests timed out"
        elif error is not None and gone is None:
            report["setup_errors"].append(error)
    report["stopped"] = gone if report["load_error"] is None else None
    return report
