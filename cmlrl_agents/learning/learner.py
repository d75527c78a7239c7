"""The learner protocol every family implements, and the optimizer bookkeeping they share.

A learner is the algorithm: it holds the optimizers (and schedulers, references, critics) and
turns a batch into optimizer steps through the one engine (engine.py): ``update(batch) ->
metrics`` (``UpdateLearner``). A ``RoundLearner`` also builds its batch from one round's
rollout tree, ``batch(tree) -> B``, which the round of ``runs/round_trainer.py`` calls; MADPO's
``DPOLearner`` updates on one pass over a round's prepared pairs (``PairEpoch``). The trainer is
the loop around it and only calls these protocols.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch

from cmlrl_agents.foundation.config import SharedConfig
from cmlrl_agents.learning.schedules import apply_learning_rates, make_schedulers

if TYPE_CHECKING:
    from cmlrl_agents.foundation.rollout import RolloutTree
    from cmlrl_agents.policies.reference import Reference

__all__ = ["Learner", "OptimizedLearner", "RoundLearner", "UpdateLearner"]

A = TypeVar("A")
B = TypeVar("B")
B_contra = TypeVar("B_contra", contravariant=True)
C = TypeVar("C", bound=SharedConfig)


class Learner(Protocol[A]):
    """What a trainer's loop and its checkpoints need of its learner, whose config is an ``A``
    (a trainer's config for the trainers' learners, ``RewardFitArgs`` for the reward model)."""

    args: A
    """The config, read at every update (a trainer hands its new one on: ``trainer.args = ``)."""
    schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR]

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The agents' optimizers, in agent order."""
        ...

    @property
    def reference_models(self) -> list[Reference] | None:
        """The agents' frozen references (None: the learner keeps none)."""
        ...

    def schedule(self, rounds: Iterable[int] | None) -> None:
        """Build the learning-rate schedules for rounds of these item counts (None: unknown)."""
        ...

    def checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
        """The trainable models and their optimizers, by checkpoint name."""
        ...

    def apply_learning_rates(self) -> None:
        """Set every optimizer to the config's rates (a resumed optimizer brings its own)."""
        ...


class UpdateLearner(Learner[A], Protocol[A, B_contra]):
    """A learner that takes every optimizer step of one batch ``B``."""

    def update(self, batch: B_contra) -> dict[str, float]:
        """Every optimizer step of one batch; their metrics."""
        ...


class RoundLearner(UpdateLearner[A, B], Protocol[A, B]):
    """A learner that trains on a round's rollout tree at once (the MAGRPO family's and the
    actor-critics'): its batch (the rows with their credit, what the update reads), then
    every optimizer step of it."""

    def batch(self, tree: RolloutTree) -> B:
        """The round's batch: each completion with its credit, and the round's metrics."""
        ...


class OptimizedLearner(Generic[C]):
    """Schedules and learning rates of a learner's named optimizers (``named_optimizers``),
    each param group at ``learning_rates(name)[i]``; ``args`` is the learner's config class."""

    args: C
    schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR]

    def named_optimizers(self) -> Mapping[str, torch.optim.Optimizer]:
        raise NotImplementedError

    def learning_rates(self, name: str) -> list[float]:
        """The config's learning rate of each param group of optimizer ``name``."""
        groups = self.named_optimizers()[name].param_groups
        return [self.args.agent_learning_rate] * len(groups)

    def steps_per_round(self, items: int) -> int | None:
        """Optimizer steps of one optimizer in a round of ``items`` items (None: unknown)."""
        return None

    def schedule(self, rounds: Iterable[int] | None) -> None:
        """Build the learning-rate schedulers for a run of rounds of these item counts (None:
        unknown, a stream); once only, so a resumed schedule is not rebuilt."""
        if self.schedulers:
            return
        total = None
        if rounds is not None:
            steps = [self.steps_per_round(r) for r in rounds]
            known = [s for s in steps if s is not None]
            total = sum(known) if len(known) == len(steps) else None
        args = self.args
        self.schedulers = make_schedulers(
            dict(self.named_optimizers()), args.lr_scheduler_type, args.warmup_steps, total
        )

    def apply_learning_rates(self) -> None:
        """The config's learning rates win over the ones a resumed optimizer brings (the
        schedule's current factor applied; see schedules.py)."""
        for name, optimizer in self.named_optimizers().items():
            apply_learning_rates(optimizer, self.schedulers.get(name), self.learning_rates(name))
