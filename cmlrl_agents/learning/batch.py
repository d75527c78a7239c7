"""The training batch: a round as the learners train on it, built once and never changed.

A :class:`PolicyRow` is one completion of one agent with its credit (advantage; the value
target and rollout-time value where a value head learns beside the actor); a
:class:`TrainBatch` is a round's rows of every agent, the windows of items its optimizer steps
train on and the round's metrics. Both are frozen plain data: the credit functions (credit.py)
build them from the rollout tree, and the learners only read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["PolicyRow", "TrainBatch", "Windows", "check_windows"]

Windows = tuple[tuple[int, ...], ...]
"""A round's optimizer steps of one pass, each as this process's item slots that it trains on:
every slot in exactly one window; under torchrun a window may hold none of this rank's items
(the rank still takes part in the step). The batch carries them, so the update does not cut
the round again from the config."""


@dataclass(frozen=True)
class PolicyRow:
    """One completion of agent ``agent`` as a row of a policy step."""

    agent: int
    item_slot: int
    """The item's position in this process's share of the round (windows are cut over it)."""
    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float
    finished: bool = True
    """The completion ended with EOS (False: cut at ``max_new_tokens``)."""
    sampler_logprobs: tuple[float, ...] | None = None
    """The sampler's log-prob of each completion token when the backend reports them (vLLM):
    the truncated importance weight corrects for its numerics (``tis_cap``)."""
    value_target: float | None = None
    """The return a value head on the actor regresses to (actor-critic)."""
    value_old: float | None = None
    """The value at rollout time (value clipping)."""


@dataclass(frozen=True)
class TrainBatch:
    """One round: every agent's rows, its optimizer steps' windows and the metrics its tree
    gave."""

    rows: tuple[PolicyRow, ...]
    windows: Windows
    """The item slots of each optimizer step of one pass over the round, in order (see
    :data:`Windows`)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Reward, return and credit metrics of the round (this process's share)."""

    def __post_init__(self) -> None:
        check_windows(self.windows, {row.item_slot for row in self.rows})

    @property
    def num_items(self) -> int:
        """Items of this process's share of the round (item slots ``0 .. num_items - 1``)."""
        return sum(len(window) for window in self.windows)


def check_windows(windows: Windows, slots: set[int]) -> None:
    """Refuse windows that are not a partition of the round's item slots ``0 .. n - 1`` or that
    leave out a slot with rows (those rows would never be trained on)."""
    flat = [slot for window in windows for slot in window]
    if sorted(flat) != list(range(len(flat))):
        raise ValueError(
            f"windows={windows!r} must hold each item slot 0 .. n - 1 exactly once (n: the "
            "items of this process's share of the round); build them with the learner's "
            "windows(num_items)"
        )
    missing = sorted(slots - set(flat))
    if missing:
        raise ValueError(
            f"rows of item slots {missing} are in no window of windows={windows!r}: they would "
            "never be trained on; give every item of the round a window"
        )
