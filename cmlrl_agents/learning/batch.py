"""The training batch: a round as the learners train on it, built once and never changed.

A :class:`PolicyRow` is one completion of one agent with its credit (advantage; the value
target and rollout-time value where a value head learns beside the actor); a
:class:`TrainBatch` is a round's rows of every agent with the round's metrics. Both are frozen
plain data: the credit functions (credit.py) build them from the rollout tree, and the learners
only read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["PolicyRow", "TrainBatch"]


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
    """One round: every agent's rows, the round's size and the metrics its tree gave."""

    rows: tuple[PolicyRow, ...]
    num_items: int
    """Items of this process's share of the round (item slots ``0 .. num_items - 1``)."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Reward, return and credit metrics of the round (this process's share)."""
