"""The sandboxed side of a code test: it answers calls of the solution's entry point (stdlib only).

Its text, after ``_code_wire``'s, is the program the sandbox runs; the last line calls
``serve(solution, entry_point, encode, decode)``. It loads the solution, says so, then answers
each request of the checker (one JSON line on fd 3: the call's arguments and the seconds left)
with the value the entry point returned or the exception it raised (one JSON line on fd 4).
It runs in the untrusted process, so nothing here has to resist the solution: the checker reads
its answers as plain values only. It only has to be right for an honest solution.
"""

import json as _json
import os as _os
import signal as _signal

TYPE_CHECKING = False  # no typing import in the program: see _code_wire
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    _Codec = Callable[[object], object]

REQUESTS_FD = 3
ANSWERS_FD = 4


class _Timeout(BaseException):
    """The call's alarm; not an ``Exception``, so the solution's ``except Exception`` lets it by."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Timeout()


def _send(message: dict[str, object]) -> None:
    data = memoryview((_json.dumps(message) + "\n").encode())
    while data:
        data = data[_os.write(ANSWERS_FD, data) :]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


def _answer(
    function: "Callable[..., object]", request: "dict[str, Any]", encode: "_Codec", decode: "_Codec"
) -> dict[str, object]:
    reply: dict[str, object] = {"id": request["id"]}
    try:
        _signal.setitimer(_signal.ITIMER_REAL, max(float(request["t"]), 0.001))
        args = [decode(a) for a in request["a"]]
        kwargs = {k: decode(v) for k, v in request["k"].items()}
        value = function(*args, **kwargs)
        try:
            reply["v"] = encode(value)
        except ValueError as exc:
            reply["e"] = f"the answer cannot be sent back: {exc}"
    except _Timeout:
        reply["e"] = "timeout"
    except BaseException as exc:
        reply["e"] = _error(exc)
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
    return reply


def serve(source: str, entry: str, encode: "_Codec", decode: "_Codec") -> None:
    """Load ``source``, then answer calls of its function ``entry`` until the checker is done."""
    _signal.signal(_signal.SIGALRM, _on_alarm)
    namespace: dict[str, Any] = {"__name__": "__solution__"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        function = namespace[entry]
    except BaseException as exc:
        _send({"id": 0, "e": _error(exc)})
        return
    _send({"id": 0, "v": None})
    with open(REQUESTS_FD, "rb") as requests:
        for line in requests:
            request = _json.loads(line)
            try:
                reply = _answer(function, request, encode, decode)
            except _Timeout:  # the alarm rang between the call's end and its reset
                reply = {"id": request["id"], "e": "timeout"}
            _send(reply)
