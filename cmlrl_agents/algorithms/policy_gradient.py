"""The MAGRPO family's learner: sibling-group advantages and policy-gradient steps per agent.

``PolicyGradientLearner.batch(tree)`` turns one round's rollout tree into a
:class:`~cmlrl_agents.learning.batch.TrainBatch` (the tree's returns and each agent's
sibling-group advantages: pure functions in :mod:`cmlrl_agents.learning.credit`);
``update(batch)`` gives each agent one optimizer step per ``items_per_step`` items of the round,
``ppo_epochs`` times over (:mod:`cmlrl_agents.learning.policy_round`: a round of several steps
trains its later ones with PPO's clipped ratio to the log-probs from before the first), through
the one engine (:mod:`cmlrl_agents.learning.engine`). It holds the agents' optimizers and frozen
reference models; the trainer (:mod:`cmlrl_agents.algorithms.magrpo`) is only the loop around it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.foundation.distributed import data_parallel
from cmlrl_agents.foundation.metrics import kl_turn_means, turn_key
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.learning.batch import TrainBatch
from cmlrl_agents.learning.credit import (
    advantage_scale,
    agent_returns,
    group_rows,
    joint_returns,
    round_metrics,
    round_stds,
)
from cmlrl_agents.learning.engine import StepEngine
from cmlrl_agents.learning.optim import agent_optimizers, refuse_shared_parameters
from cmlrl_agents.learning.policy_loss import PolicyObjective
from cmlrl_agents.learning.policy_round import PolicyLearner
from cmlrl_agents.policies.adapters import checkpoint_models
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.reference import Reference, reference_policies

__all__ = ["PolicyGradientLearner"]


class PolicyGradientLearner(PolicyLearner[MAGRPOConfig]):
    """Per agent: its AdamW optimizer and (with ``reference_kl_enabled``) its frozen reference.

    ``args`` is read at every update, so a trainer may hand a new config between rounds
    (``learner.args = new``); the reference models are built once, here.
    """

    def __init__(self, agents: Sequence[LLMAgent], args: MAGRPOConfig, num_turns: int) -> None:
        self.agents = list(agents)
        self.args = args
        self.num_turns = num_turns
        """The task's turns (the task spec owns them; fixed for the learner's life)."""
        self.parallel = data_parallel()
        """This process's share of a data parallel launch (see distributed.py)."""
        self.parallel.broadcast_parameters(a.model for a in self.agents)
        self.engine = StepEngine(self.parallel, bf16=args.bf16)
        self.optimizers = agent_optimizers(self.agents, args)
        refuse_shared_parameters(self.named_optimizers())
        devices = resolve_devices(args.reference_devices, len(self.agents), "reference_devices")
        self.reference_models: list[Reference] | None = (
            reference_policies(self.agents, devices) if args.reference_kl_enabled else None
        )
        """Per agent: a frozen copy, or (adapter agents) the base with adapters disabled."""
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        """Per optimizer (``agent_i``), when ``lr_scheduler_type``/``warmup_steps`` ask for one."""

    def named_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {f"agent_{i}": opt for i, opt in enumerate(self.optimizers)}

    def steps_per_round(self, items: int) -> int:
        return self.args.ppo_epochs * math.ceil(items / self.args.items_per_step)

    def objective(self) -> PolicyObjective:
        """The loss settings of the current config."""
        args, refs = self.args, self.reference_models
        return PolicyObjective.of(
            args,
            len(self.agents),
            kl_coef=None if refs is None else args.reference_kl_coef,
            clip_range=args.ppo_clip_range,
            aggregation=args.loss_aggregation,
            prefix_sharing=args.prefix_sharing,
        )

    # -- the batch ------------------------------------------------------------------------------
    def batch(self, tree: RolloutTree) -> TrainBatch:
        """The round's rows (each agent's completions with their group advantages; without
        the truncated ones under ``mask_truncated_completions``) and its reward, return and
        completion metrics."""
        args = self.args
        joint = joint_returns(tree, args.discount)
        credit = agent_returns(tree, joint)
        scale = advantage_scale(args.advantage_normalization)
        # Under "batch" the round's std: every rank's share of it, in one all-reduce.
        stds = round_stds(credit, scale, len(self.agents), self.num_turns, self.parallel.sum_vector)
        rows = group_rows(tree, credit, args.advantage_mode, scale, stds)
        if args.mask_truncated_completions:  # after the advantages: they count in the groups
            rows = [row for row in rows if row.finished]
        metrics = round_metrics(tree, joint)
        for level, returns in zip(tree.levels, credit, strict=True):
            for a in range(tree.num_agents):
                key = f"agent_{a}/" + turn_key(level.turn, "expected_return")
                metrics[key] = float(returns[:, a].mean())
        return TrainBatch(tuple(rows), self.windows(len(tree.items)), metrics)

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: TrainBatch) -> dict[str, float]:
        """Every agent's steps on ``batch``; the round's metrics.

        Under torchrun the steps are those of the whole round over all ranks (the batch's
        windows): every rank takes part in each, even one without items.
        """
        epochs = self.args.ppo_epochs
        policy = self.policy_round(batch.rows, batch.windows, self.objective(), epochs)
        for s in range(len(policy.steps)):
            for group in policy.groups:
                policy.step(s, group)
        return self._round_metrics(batch, policy.metrics())

    def _round_metrics(self, batch: TrainBatch, steps: dict[str, float]) -> dict[str, float]:
        metrics = {**batch.metrics, **steps}
        n = len(self.agents)
        for key in ("loss", "grad_norm"):
            metrics[key] = sum(steps[f"agent_{a}/{key}"] for a in range(n)) / n
        metrics.update(kl_turn_means(metrics, n, self.num_turns))
        return metrics

    # -- saving ---------------------------------------------------------------------------------
    def checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, object]]:
        """The trainable models and their optimizers, by checkpoint name."""
        return checkpoint_models(self.agents), dict(self.named_optimizers())
