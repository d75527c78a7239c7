"""The MAGRPO family's learner: sibling-group advantages and policy-gradient steps per agent.

``PolicyGradientLearner.batch(tree)`` turns one round's rollout tree into a
:class:`~cmlrl_agents.learning.batch.TrainBatch` (the tree's returns and each agent's
sibling-group advantages: pure functions in :mod:`cmlrl_agents.learning.credit`);
``update(batch)`` gives each agent one optimizer step per ``items_per_step`` items of the round
through the one engine (:mod:`cmlrl_agents.learning.engine`), ``ppo_epochs`` times over, the
loss of :mod:`cmlrl_agents.learning.policy_step`. It holds the agents' optimizers and frozen
reference models; the trainer (:mod:`cmlrl_agents.algorithms.magrpo`) is only the loop around it.

When a round takes several steps, its later steps train on samples of a policy that has since
moved: every row then keeps its log-probs from before the round's first step (the first step's
own rows from its pass, the others from a pass without gradient before it), and its loss is
PPO's clipped ratio to them (``ppo_clip_range``). A round of one step is on-policy: the plain
policy gradient, whose gradient the clipped form has at ratio 1 anyway.
"""

from __future__ import annotations

import math
from collections import defaultdict
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
from cmlrl_agents.learning.engine import StepEngine, mean_metrics
from cmlrl_agents.learning.learner import OptimizedLearner
from cmlrl_agents.learning.optim import agent_optimizers
from cmlrl_agents.learning.policy_loss import PolicyObjective
from cmlrl_agents.learning.policy_metrics import policy_metrics
from cmlrl_agents.learning.policy_step import PolicyStep, round_steps
from cmlrl_agents.policies.adapters import checkpoint_models, step_groups
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.reference import Reference, reference_policies

__all__ = ["PolicyGradientLearner"]


class PolicyGradientLearner(OptimizedLearner[MAGRPOConfig]):
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
        self.optimizers = agent_optimizers(self.agents, args.agent_learning_rate, args.weight_decay)
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
        return TrainBatch(tuple(rows), len(tree.items), metrics)

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: TrainBatch) -> dict[str, float]:
        """Every agent's steps on ``batch``; the round's metrics.

        Under torchrun the steps are those of the whole round over all ranks
        (:meth:`DataParallel.windows`): every rank takes part in each, even one without items.
        """
        args, rows = self.args, batch.rows
        objective = self.objective()
        step = PolicyStep(
            self.agents,
            self.reference_models,
            objective,
            self.num_turns,
            precision=self.engine.autocast,
        )
        round_items = int(self.parallel.sum(batch.num_items))
        steps = round_steps(
            self.parallel.windows(round_items, args.items_per_step), args.ppo_epochs
        )
        stale = len(steps) > 1
        per_step: dict[str, list[float]] = defaultdict(list)
        for group in step_groups(self.agents):
            mine = [[i for i, r in enumerate(rows) if r.agent == a] for a in group]
            size = args.forward_batch_size
            old = step.old_logprobs(group, rows, mine, size, steps[0]) if stale else None
            optimizers = {f"agent_{a}": self.optimizers[a] for a in group}
            for s, slots in enumerate(steps):
                indices = [[i for i in idx if rows[i].item_slot in slots] for idx in mine]
                plan = step.plan(
                    group,
                    rows,
                    indices,
                    optimizers,
                    chunk_size=size,
                    old=old,
                    record_old=stale and s == 0,
                )
                result = self.engine.step(
                    plan, max_grad_norm=args.max_grad_norm, schedulers=self.schedulers
                )
                stats = policy_metrics(
                    result.stats, result.totals, group, objective, self.num_turns
                )
                for name, values in stats.items():
                    for key, value in values.items():
                        per_step[f"{name}/{key}"].append(value)
        return self._round_metrics(batch, mean_metrics(per_step))

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
