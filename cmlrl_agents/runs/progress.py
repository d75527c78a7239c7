"""Training progress: a tqdm bar in a terminal, plain lines elsewhere, or nothing.

A run's output is often not a terminal: a notebook, ``cmlrl train > log``, a job scheduler. A
bar redrawn with carriage returns is unreadable there, and printing nothing at all left a
newcomer waiting twenty minutes without a sign of life. So when ``verbose`` is left at None and
stdout is not a terminal, progress comes as lines (``LINES``): one after the first round, then at
most one a minute, with the items done, the time spent and an estimate of the time left.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from tqdm import tqdm

__all__ = ["LINES", "LINE_INTERVAL", "ProgressBar", "progress_line"]

LINES = "lines"
"""``verbose`` value of a run whose progress is printed as lines (see the module doc)."""
LINE_INTERVAL = 60.0
"""Seconds between two progress lines at least (a line is printed after a round)."""


class ProgressBar:
    """Progress over task items: a tqdm bar (``verbose=True``), lines (``verbose=LINES``) or
    nothing (``False``)."""

    def __init__(
        self,
        total: int | None,
        *,
        verbose: bool | str,
        desc: str = "",
        unit: str = "item",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lines = verbose == LINES
        disable = self._lines or not verbose
        self._bar = tqdm(total=total, desc=desc, unit=unit, disable=disable, dynamic_ncols=True)
        self._total, self._desc, self._clock = total, desc, clock
        self._start = clock()
        self._done = 0
        self._base: tuple[float, int] | None = None  # (time, items) after the first update
        self._printed_at: float | None = None
        self._printed_done = -1  # the items shown by the last line
        self._postfix: dict[str, Any] = {}

    def update(self, n: int = 1, postfix: Mapping[str, float] | None = None) -> None:
        """Advance by `n` items and show `postfix` (e.g. `{"reward": 0.41}`) beside the bar.

        The trainers' first call gives the items already done (0, or a resumed run's position):
        the time-left estimate uses the rate since then."""
        shown = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in (postfix or {}).items()}
        if shown:
            self._bar.set_postfix(shown, refresh=False)
            self._postfix = shown
        self._bar.update(n)
        if not self._lines:
            return
        self._done += n
        now = self._clock()
        if self._base is None:
            self._base = (now, self._done)
        elif self._printed_at is None or now - self._printed_at >= LINE_INTERVAL:
            self._print(now)

    def _print(self, now: float) -> None:
        assert self._base is not None
        self._printed_at, self._printed_done = now, self._done
        since, base = self._base
        line = progress_line(self._desc, self._done, self._total, now - self._start)
        if self._total is not None and self._done > base and self._done < self._total:
            left = (now - since) / (self._done - base) * (self._total - self._done)
            line += f", about {_minutes(left)} left"
        extra = ", ".join(f"{k}={v}" for k, v in self._postfix.items())
        print(line + (f"; {extra}" if extra else ""), flush=True)

    def close(self) -> None:
        if self._lines and self._printed_at is not None and self._done != self._printed_done:
            self._print(self._clock())  # the final state, unless the last line showed it
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_line(desc: str, done: int, total: int | None, seconds: float) -> str:
    """``"magrpo: 2/8 items (25%) in 3.0 min"``."""
    line = f"{desc}: {done}" + (f"/{total}" if total is not None else "") + " items"
    if total:
        line += f" ({100 * done / total:.0f}%)"
    return f"{line} in {_minutes(seconds)}"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
