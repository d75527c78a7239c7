"""A separate critic's optimizer step: its value loss over a round's states, as an engine plan.

Each state is read once per step (a chunk is ``forward_batch_size`` distinct states) and every
sample of it regresses to its GAE return, so a state shared by G samples weighs G times; the
loss is the mean over the step's samples (over every rank's share), clipped around the
rollout-time values when ``value_clip_range`` is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from cmlrl_agents.algorithms.actor_critic_config import ActorCriticConfig
from cmlrl_agents.algorithms.actor_critic_rollouts import RolloutSample, StateKey
from cmlrl_agents.functional.losses import value_loss
from cmlrl_agents.learning.engine import ChunkLoss, StepPlan
from cmlrl_agents.policies.value_head import ValueModel

__all__ = ["critic_plan"]

CriticInputs = dict[StateKey, list[int]]


def critic_plan(
    name: str,
    critic: ValueModel,
    optimizer: torch.optim.Optimizer,
    rows: Sequence[RolloutSample],
    inputs: CriticInputs,
    pad_id: int,
    args: ActorCriticConfig,
) -> StepPlan[list[StateKey]]:
    """One step of critic ``name`` (``critic_c``) over ``rows``, which read ``inputs``."""
    keys = list(dict.fromkeys(s.state_key for s in rows))
    size = args.forward_batch_size or max(len(keys), 1)
    chunks = [keys[s : s + size] for s in range(0, len(keys), size)]
    by_state: dict[StateKey, list[RolloutSample]] = {}
    for s in rows:
        by_state.setdefault(s.state_key, []).append(s)

    def count(chunk: list[StateKey]) -> dict[str, float]:
        return {f"{name}/samples": float(sum(len(by_state[k]) for k in chunk))}

    def loss(chunk: list[StateKey], totals: Mapping[str, float]) -> ChunkLoss:
        critic.train()
        values = critic.values([inputs[k] for k in chunk], pad_id, grad=True)
        index = [i for i, k in enumerate(chunk) for _ in by_state[k]]
        picked = [s for k in chunk for s in by_state[k]]
        device = values.device
        targets = torch.tensor([s.returns for s in picked], device=device)
        old = None
        if args.value_clip_range is not None:
            old = torch.tensor([s.value for s in picked], device=device)
        part = value_loss(
            values[torch.tensor(index, device=device)],
            targets,
            old,
            args.value_clip_range,
            check=False,
        )
        part = part * (len(picked) / totals[f"{name}/samples"])
        return ChunkLoss(args.value_loss_coef * part, {f"{name}/value_loss": part.detach()})

    return StepPlan(
        optimizers={name: optimizer},
        chunks=chunks,
        count=count,
        loss=loss,
        count_keys=[f"{name}/samples"],
        sum_keys=[f"{name}/value_loss"],
    )
