"""Where a run is: the counters the training loop advances and a checkpoint restores.

Plain data (no model, no file): :class:`RunState` is what a trainer's checkpoint records beside
the weights, and what a resumed trainer takes back.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RunState"]


class RunState:
    """The run's counters: epochs, the position in the epoch, rounds, items and env steps seen,
    the seed of its sampling keys, and the best evaluation metric so far."""

    epoch: int
    epoch_position: int
    rounds: int
    items_seen: int
    env_step: int
    sample_seed: int
    best_metric: float | None

    def start_state(self, sample_seed: int) -> None:
        """A fresh run's counters."""
        self.epoch = self.epoch_position = self.rounds = self.items_seen = self.env_step = 0
        self.sample_seed = sample_seed
        self.best_metric = None

    def state_counters(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "epoch_position": self.epoch_position,
            "rounds": self.rounds,
            "items_seen": self.items_seen,
            "env_step": self.env_step,
            "sample_seed": self.sample_seed,
            "best_metric": self.best_metric,
        }

    def load_counters(self, state: dict[str, Any]) -> None:
        self.epoch, self.epoch_position = state["epoch"], state["epoch_position"]
        self.rounds = state.get("rounds", 0)  # checkpoints before 2026-12-08 did not count them
        self.items_seen, self.env_step = state["items_seen"], state["env_step"]
        self.sample_seed, self.best_metric = state["sample_seed"], state["best_metric"]
