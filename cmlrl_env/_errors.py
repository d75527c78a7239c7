"""Adding context to a user function's exception without changing its type."""

from __future__ import annotations

__all__ = ["add_context", "describe_callable", "describe_exception"]


def add_context(exc: BaseException, message: str) -> BaseException:
    """Attach ``message`` to ``exc`` so the traceback says where it happened.

    The user's own exception type and traceback are kept (never swallowed or re-typed), so
    ``except KeyError`` in user code still works.
    """
    exc.add_note(message)
    return exc


def describe_callable(func: object) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    return name if name else repr(func)


def describe_exception(exc: BaseException) -> str:
    """``"KeyError: 'x' (raised by reward_func r ...)"``: type, message and notes on one line."""
    notes = getattr(exc, "__notes__", None)
    return f"{type(exc).__name__}: {exc}" + (f" ({'; '.join(notes)})" if notes else "")
