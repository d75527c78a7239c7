"""``RewardModelLearner``: Bradley-Terry fits of a :class:`PreferenceRewardModel`.

The reward model's learner, under the protocol every family implements: ``update(fit)`` takes
every optimizer step of one :class:`RewardFit` (its pairs, shuffled each epoch by its seed)
through the one engine (:mod:`cmlrl_agents.learning.engine`) and returns the fit's metrics.
:meth:`PreferenceRewardModel.fit` is one such update; MARLHF holds one learner and gives it
each round's pairs.

Each fit starts a fresh AdamW and schedule from the current weights, so the weights are the
whole state between fits: a resumed MARLHF run, which reloads them, fits as an uninterrupted one
(nothing else to checkpoint).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor

from cmlrl_agents.algorithms.preference_pairs import PreferencePair
from cmlrl_agents.foundation.distributed import data_parallel
from cmlrl_agents.functional.preference_losses import bradley_terry_loss
from cmlrl_agents.learning.engine import ChunkLoss, StepEngine, StepPlan
from cmlrl_agents.learning.optim import AdamWOptions, make_adamw
from cmlrl_agents.learning.schedules import make_schedulers

__all__ = ["PairScorer", "RewardFit", "RewardFitArgs", "RewardModelLearner"]


class PairScorer(Protocol):
    """What a fit needs of a reward model (:class:`PreferenceRewardModel` is one)."""

    model: torch.nn.Module
    forward_batch_size: int | None

    def pair_scores(self, pairs: Sequence[PreferencePair]) -> tuple[Tensor, Tensor]:
        """The chosen and rejected joint responses' scores ``[P]`` each (differentiable)."""
        ...

    def accuracy(self, pairs: Sequence[PreferencePair]) -> float:
        """Share of ``pairs`` whose chosen joint response scores higher."""
        ...


@dataclass(frozen=True)
class RewardFit:
    """One fit's data: the pairs it trains on, held-out pairs it reports the accuracy of, and
    the seed of its per-epoch shuffles."""

    train: Sequence[PreferencePair]
    held: Sequence[PreferencePair] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.train:
            raise ValueError("a reward fit needs at least one training pair (train is empty).")


@dataclass(frozen=True)
class RewardFitArgs:
    """How a fit trains: AdamW at ``learning_rate`` and ``weight_decay``, ``batch_size`` pairs
    per optimizer step for ``epochs`` passes, gradients clipped at ``max_grad_norm`` (None: no
    clip), and the ``lr_scheduler_type`` / ``warmup_steps`` schedule over the fit's steps."""

    learning_rate: float = 1e-4
    epochs: int = 1
    batch_size: int = 8
    max_grad_norm: float | None = 1.0
    weight_decay: float = 0.0
    lr_scheduler_type: str = "constant"
    warmup_steps: int = 0

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate!r}.")


class RewardModelLearner:
    """Fits ``model`` on :class:`RewardFit` batches with ``args`` (one fit per ``update``)."""

    def __init__(self, model: PairScorer, args: RewardFitArgs) -> None:
        self.model = model
        self.args = args
        self.parallel = data_parallel()
        self.engine = StepEngine(self.parallel)
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        """The last fit's schedule (each fit builds its own over its steps)."""
        self._optimizer: torch.optim.Optimizer | None = None

    # -- the protocol's bookkeeping: the weights are the whole state between fits -------------
    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The last fit's optimizer (none before the first fit)."""
        return [] if self._optimizer is None else [self._optimizer]

    @property
    def reference_models(self) -> None:
        return None

    def schedule(self, rounds: Iterable[int] | None) -> None:
        """Nothing to build ahead: each fit schedules its own steps."""

    def checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
        return {"reward_model": self.model.model}, {}

    def apply_learning_rates(self) -> None:
        """Nothing to set: each fit starts a fresh optimizer at ``args.learning_rate``."""

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: RewardFit) -> dict[str, float]:
        """Bradley-Terry training on ``batch.train``; returns ``reward_model/loss`` (the last
        epoch's mean), ``reward_model/train_accuracy`` and, with held-out pairs,
        ``reward_model/eval_accuracy`` (before the fit: ``reward_model/eval_accuracy_before``)."""
        args, model = self.args, self.model
        metrics = {}
        if batch.held:
            metrics["reward_model/eval_accuracy_before"] = model.accuracy(batch.held)
        params = [p for p in model.model.parameters() if p.requires_grad]
        optimizer = make_adamw(
            params, args.learning_rate, "reward_model", AdamWOptions(weight_decay=args.weight_decay)
        )
        steps = args.epochs * -(-len(batch.train) // args.batch_size)
        self.schedulers = make_schedulers(
            {"reward_model": optimizer}, args.lr_scheduler_type, args.warmup_steps, steps
        )
        self._optimizer = optimizer
        rng = random.Random(batch.seed)
        for _ in range(args.epochs):
            order, losses = list(batch.train), []
            rng.shuffle(order)
            model.model.train()
            for start in range(0, len(order), args.batch_size):
                window = order[start : start + args.batch_size]
                # Under torchrun each rank scores its block of the step's pairs.
                plan = self._step_plan(self.parallel.shard(window, len(window)), optimizer)
                result = self.engine.step(
                    plan, max_grad_norm=args.max_grad_norm, schedulers=self.schedulers
                )
                losses.append(result.stats["loss"])
            metrics["reward_model/loss"] = sum(losses) / len(losses)
        model.model.eval()
        metrics["reward_model/train_accuracy"] = model.accuracy(batch.train)
        metrics["reward_model/train_pairs"] = float(len(batch.train))
        if batch.held:
            metrics["reward_model/eval_accuracy"] = model.accuracy(batch.held)
            metrics["reward_model/eval_pairs"] = float(len(batch.held))
        return metrics

    def _step_plan(
        self, pairs: Sequence[PreferencePair], optimizer: torch.optim.Optimizer
    ) -> StepPlan[Sequence[PreferencePair]]:
        """One Bradley-Terry step over ``pairs``, half the model's ``forward_batch_size`` pairs
        (their two texts each) per backward."""
        per_forward = self.model.forward_batch_size
        size = -(-per_forward // 2) if per_forward else max(len(pairs), 1)
        return StepPlan(
            optimizers={"reward_model": optimizer},
            chunks=[pairs[i : i + size] for i in range(0, len(pairs), size)],
            count=lambda chunk: {"pairs": float(len(chunk))},
            loss=self._chunk_loss,
            count_keys=["pairs"],
            sum_keys=["loss"],
        )

    def _chunk_loss(
        self, chunk: Sequence[PreferencePair], totals: Mapping[str, float]
    ) -> ChunkLoss:
        """A chunk's Bradley-Terry loss, its share of the step's mean over pairs."""
        scores = self.model.pair_scores(chunk)
        loss = bradley_terry_loss(*scores) * (len(chunk) / totals["pairs"])
        return ChunkLoss(loss, {"loss": loss.detach()})
