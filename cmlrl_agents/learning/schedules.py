"""Learning-rate schedules with warmup, from ``transformers.get_scheduler``.

``lr_scheduler_type`` is one of ``LR_SCHEDULER_TYPES``; with ``"constant"`` and
``warmup_steps=0`` (the defaults) no scheduler exists and the learning rate stays the config's.
Steps are optimizer steps of one optimizer (each agent's and each critic's schedule advances
with its own steps); the schedulers are saved in checkpoints and resumed with them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch
from transformers import get_scheduler

from cmlrl_agents.foundation.config import LR_SCHEDULER_TYPES

__all__ = [
    "LR_SCHEDULER_TYPES",
    "apply_learning_rates",
    "make_schedulers",
    "round_sizes",
    "steps_per_round",
]

# Our names are the shapes after warmup; transformers names the warmed-up constant differently.
_TRANSFORMERS_NAMES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}


def make_schedulers(
    optimizers: Mapping[str, torch.optim.Optimizer],
    kind: str,
    warmup_steps: int,
    total_steps: int | None,
) -> dict[str, torch.optim.lr_scheduler.LambdaLR]:
    """One scheduler per optimizer (by the same name); ``{}`` when there is no schedule."""
    if kind == "constant" and warmup_steps == 0:
        return {}
    if kind != "constant" and total_steps is None:
        raise ValueError(
            f"lr_scheduler_type={kind!r} decays over the run's optimizer steps, which are "
            "not known without a map-style train_dataset (a stream has no length); use "
            "lr_scheduler_type='constant' (with warmup_steps for warmup) or a map-style Dataset."
        )
    return {
        name: get_scheduler(
            _TRANSFORMERS_NAMES[kind],
            optimizer,
            num_warmup_steps=warmup_steps,
            num_training_steps=total_steps,
        )
        for name, optimizer in optimizers.items()
    }


def apply_learning_rates(
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LambdaLR | None,
    lrs: Sequence[float],
) -> None:
    """Give each param group its config lr (``lrs[i]``), scaled by the schedule's current factor.

    A resumed optimizer brings its saved lr, and the config (possibly changed for the resume)
    must win; with a scheduler the config lr becomes its base lr, so the schedule goes on.
    """
    if scheduler is not None:
        scheduler.base_lrs = list(lrs)
    for i, (group, lr) in enumerate(zip(optimizer.param_groups, lrs, strict=True)):
        if scheduler is not None:
            group["initial_lr"] = lr
            lr = lr * scheduler.lr_lambdas[i](scheduler.last_epoch)
        group["lr"] = lr


def round_sizes(num_items: int, rollout_size: int) -> Iterable[int]:
    """The item counts of one epoch's rounds, as ``TeamTrainer`` cuts them: ``rollout_size``
    items each, the last one what is left (evaluation never cuts a round)."""
    for start in range(0, num_items, rollout_size):
        yield min(rollout_size, num_items - start)


def steps_per_round(items: int, items_per_step: int, epochs: int = 1) -> int:
    """Optimizer steps of one optimizer in a round of ``items`` items."""
    return epochs * math.ceil(items / items_per_step)
