"""The MAGRPO family's learner: sibling-group advantages and one policy-gradient step per agent.

``PolicyGradientLearner.update(tree)`` takes one round's rollout tree, computes the tree's
returns and each agent's sibling-group advantages (pure functions in :mod:`returns` and
:mod:`advantages`), then gives each agent one optimizer step per ``items_per_step`` items, each
step's loss from batched padded forwards. It holds the agents' optimizers and frozen reference
models; the trainer (:mod:`cmlrl_agents.algorithms.magrpo`) is only the loop around it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.algorithms.optim import clip_and_step, make_adamw
from cmlrl_agents.algorithms.schedules import apply_learning_rates, make_schedulers, steps_per_round
from cmlrl_agents.functional.advantages import group_advantages
from cmlrl_agents.functional.losses import kl_k3, policy_gradient_loss
from cmlrl_agents.policies.adapters import checkpoint_models, joint_groups, joint_pass
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.reference import (
    Reference,
    kl_turn_means,
    kl_turn_stats,
    reference_kl,
    reference_policies,
)
from cmlrl_agents.policies.tokens import TokenBatch, build_batch
from cmlrl_agents.runs.distributed import data_parallel
from cmlrl_agents.runs.metrics import turn_metrics
from cmlrl_agents.runs.rollout import RolloutTree

__all__ = ["PolicyGradientLearner", "Sample", "StepTotals", "agent_samples"]


@dataclass(frozen=True)
class Sample:
    """One completion of one agent with its advantage: a row of the policy-gradient batch."""

    item_slot: int
    turn: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    advantage: float


def agent_samples(
    tree: RolloutTree,
    agent: int,
    agent_returns: list[torch.Tensor],
    advantage_mode: str,
    advantage_normalization: bool,
) -> list[Sample]:
    """Every completion of ``agent`` in the tree, its advantage taken over its G siblings."""
    samples = []
    for level, returns in zip(tree.levels, agent_returns, strict=True):
        adv = group_advantages(returns[:, agent, :], advantage_mode, advantage_normalization)
        for branch, row in enumerate(level.completions[agent]):
            for g, completion in enumerate(row):
                samples.append(
                    Sample(
                        item_slot=level.item_slot[branch],
                        turn=level.turn,
                        prompt_ids=completion.prompt_ids,
                        completion_ids=completion.completion_ids,
                        advantage=float(adv[branch, g]),
                    )
                )
    return samples


class StepTotals:
    """One optimizer step's summed loss and per-sample KLs (by turn), kept as tensors until the
    step ends: reading a value on the host waits for the device, so a step reads once
    (:meth:`read`) instead of after every forward chunk."""

    def __init__(self) -> None:
        self._loss: torch.Tensor | None = None
        self._kls: list[torch.Tensor] = []
        self._turns: list[int] = []

    def add(self, loss: torch.Tensor, samples: Sequence[Sample], kl: torch.Tensor | None) -> None:
        """A chunk's loss share and, with a reference model, its samples' KLs."""
        self._loss = loss.detach() if self._loss is None else self._loss + loss.detach()
        if kl is not None:
            self._kls.append(kl)
            self._turns.extend(s.turn for s in samples)

    def read(self) -> tuple[float, dict[int, list[float]]]:
        """``(loss, {turn: [kl, ...]})`` on the host."""
        loss = 0.0 if self._loss is None else float(self._loss)
        by_turn: dict[int, list[float]] = defaultdict(list)
        if self._kls:
            values = torch.cat(self._kls)
            for turn, value in zip(self._turns, values.tolist(), strict=True):
                by_turn[turn].append(value)
        return loss, by_turn


class PolicyGradientLearner:
    """Per agent: its AdamW optimizer and (with ``reference_kl_enabled``) its frozen reference.

    ``args`` is read at every update, so a trainer may hand a new config between rounds
    (``learner.args = new``); the reference models are built once, here.
    """

    def __init__(self, agents: Sequence[LLMAgent], args: MAGRPOConfig) -> None:
        self.agents = list(agents)
        self.args = args
        self.parallel = data_parallel()
        """This process's share of a data parallel launch (see distributed.py)."""
        self.parallel.broadcast_parameters(a.model for a in self.agents)
        self.optimizers: list[torch.optim.Optimizer] = [
            make_adamw(agent.trainable_parameters(), args.agent_learning_rate, f"agents[{i}]")
            for i, agent in enumerate(self.agents)
        ]
        devices = resolve_devices(args.reference_devices, len(self.agents), "reference_devices")
        self.reference_models: list[Reference] | None = (
            reference_policies(self.agents, devices) if args.reference_kl_enabled else None
        )
        """Per agent: a frozen copy, or (adapter agents) the base with adapters disabled."""
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        """Per optimizer (``agent_i``), when ``lr_scheduler_type``/``warmup_steps`` ask for one."""

    def schedule(self, rounds: Iterable[int] | None) -> None:
        """Build the learning-rate schedulers for a run of rounds of these item counts (None:
        unknown, a stream); once only, so a resumed schedule is not rebuilt."""
        if self.schedulers:
            return
        per_step = self.args.items_per_step
        total = None if rounds is None else sum(steps_per_round(r, per_step) for r in rounds)
        optimizers = {f"agent_{i}": opt for i, opt in enumerate(self.optimizers)}
        args = self.args
        self.schedulers = make_schedulers(
            optimizers, args.lr_scheduler_type, args.warmup_steps, total
        )

    def update(self, tree: RolloutTree) -> dict[str, float]:
        """One round: returns, advantages and every agent's steps; the round's metrics."""
        args = self.args
        joint_returns = tree.returns(args.discount) if tree.levels else []  # an empty shard
        metrics = turn_metrics(tree, joint_returns)
        agent_returns = tree.agent_returns(joint_returns)
        losses, norms = [], []
        samples = [
            agent_samples(tree, a, agent_returns, args.advantage_mode, args.advantage_normalization)
            for a in range(len(self.agents))
        ]
        per_agent = self.update_agents(samples)
        for a, stats in enumerate(per_agent):
            for level, returns in zip(tree.levels, agent_returns, strict=True):
                stats[f"turn_{level.turn}/expected_return"] = float(returns[:, a].mean())
            metrics.update({f"agent_{a}/{k}": v for k, v in stats.items()})
            losses.append(stats["loss"])
            norms.append(stats["grad_norm"])
        metrics["loss"] = sum(losses) / len(losses)
        metrics["grad_norm"] = sum(norms) / len(norms)
        metrics.update(kl_turn_means(metrics, len(self.agents), self.args.num_turns))
        return metrics

    def update_agents(self, samples: list[list[Sample]]) -> list[dict[str, float]]:
        """Every agent's steps (``samples[a]``): adapter agents of one base (without active
        dropout) score together in mixed-adapter passes, the others one by one."""
        out: list[dict[str, float]] = [{} for _ in self.agents]
        joint = joint_groups(self.agents)
        for group in joint:
            stats = self.update_group(group, [samples[a] for a in group])
            for a, agent_stats in zip(group, stats, strict=True):
                out[a] = agent_stats
        # Sorted: under torchrun every rank must all-reduce the agents in the same order.
        for a in sorted(set(range(len(self.agents))) - {a for g in joint for a in g}):
            out[a] = self.update_agent(a, samples[a])
        return out

    def update_agent(self, a: int, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step per ``train_batch_size`` items; returns mean loss and grad norm."""
        return self.update_group([a], [samples])[0]

    def update_group(self, group: list[int], samples: list[list[Sample]]) -> list[dict[str, float]]:
        """:meth:`update_agent` for the agents of ``group`` together (``samples[k]`` is agent
        ``group[k]``'s): several agents step from joint passes (:meth:`step_joint`).

        Under torchrun the steps are those of the whole round over all ranks
        (:meth:`DataParallel.windows`): every rank takes part in each, even one without items.
        """
        slots = sorted({s.item_slot for rows in samples for s in rows})
        round_items = int(self.parallel.sum(len(slots)))
        stats: list[dict[str, list[float]]] = [defaultdict(list) for _ in group]
        for window in self.parallel.windows(round_items, self.args.items_per_step):
            chosen = {slots[i] for i in window}
            rows = [[s for s in agent_rows if s.item_slot in chosen] for agent_rows in samples]
            step_stats = (
                [self.step(group[0], rows[0])] if len(group) == 1 else self.step_joint(group, rows)
            )
            for into, got in zip(stats, step_stats, strict=True):
                for key, value in got.items():
                    into[key].append(value)
        return [{key: sum(v) / len(v) for key, v in st.items()} for st in stats]

    def step_joint(self, group: list[int], rows: list[list[Sample]]) -> list[dict[str, float]]:
        """One optimizer step of each agent of ``group`` (adapters of one base) from passes that
        score every agent's rows together (``forward_batch_size`` rows each); each agent's loss
        is scaled exactly as in :meth:`step`, and its adapter receives only its own gradient."""
        args, agents = self.args, [self.agents[a] for a in group]
        for a in group:
            self.optimizers[a].zero_grad(set_to_none=True)
        flat = [(k, s) for k, agent_rows in enumerate(rows) for s in agent_rows]
        # Normalised by all ranks' counts, as in step.
        totals = [
            int(self.parallel.sum(sum(len(s.completion_ids) for s in agent_rows)))
            for agent_rows in rows
        ]
        counts = [int(self.parallel.sum(len(agent_rows))) for agent_rows in rows]
        size = args.forward_batch_size or max(len(flat), 1)  # a rank may have no rows
        step_sums = [StepTotals() for _ in group]
        for start in range(0, len(flat), size):
            chunk = flat[start : start + size]
            refs = self.reference_models  # the group's one reference: their base, adapters off
            scored = joint_pass(
                agents, [k for k, _ in chunk], [s.prompt_ids for _, s in chunk],
                [s.completion_ids for _, s in chunk], None if refs is None else refs[group[0]],
                prefix_sharing=args.prefix_sharing,
            )  # fmt: skip
            batch, logprobs, ref = scored.batch, scored.logprobs, scored.reference
            total = logprobs.new_zeros(())
            for k, a in enumerate(group):
                idx = scored.rows(k)
                if not idx:
                    continue
                mine = [chunk[i][1] for i in idx]
                sub = batch.select(idx)
                loss, kl = self._loss(
                    a, mine, logprobs[idx], sub, counts[k], totals[k],
                    None if ref is None else ref[idx],
                )  # fmt: skip
                total = total + loss
                step_sums[k].add(loss, mine, kl)
            total.backward()
        return [self._finish_step(a, step_sums[k]) for k, a in enumerate(group)]

    def step(self, a: int, samples: list[Sample]) -> dict[str, float]:
        """One optimizer step of agent ``a`` over ``samples`` (forwards of
        ``forward_batch_size`` rows, scaled so that chunking changes nothing)."""
        agent, optimizer, args = self.agents[a], self.optimizers[a], self.args
        agent.model.train()
        optimizer.zero_grad(set_to_none=True)
        # Normalised by all ranks' counts, so that summed gradients are the one-process gradient.
        total_tokens = int(self.parallel.sum(sum(len(s.completion_ids) for s in samples)))
        num_samples = int(self.parallel.sum(len(samples)))
        size = args.forward_batch_size or max(len(samples), 1)
        totals = StepTotals()
        for start in range(0, len(samples), size):
            chunk = samples[start : start + size]
            batch = build_batch(
                [s.prompt_ids for s in chunk], [s.completion_ids for s in chunk],
                agent.pad_token_id,
            ).to(agent.device)  # fmt: skip
            logprobs = agent.score(batch, prefix_sharing=args.prefix_sharing)
            loss, kl = self._loss(a, chunk, logprobs, batch, num_samples, total_tokens)
            loss.backward()
            totals.add(loss, chunk, kl)
        return self._finish_step(a, totals)

    def _finish_step(self, a: int, totals: StepTotals) -> dict[str, float]:
        """Clip and step agent ``a``'s optimizer (and scheduler); the step's stats."""
        args, optimizer = self.args, self.optimizers[a]
        loss_sum, kl_by_turn = totals.read()
        self.parallel.sum_gradients(p for g in optimizer.param_groups for p in g["params"])
        norm = clip_and_step(optimizer, args.max_grad_norm)
        stats = {"loss": self.parallel.sum(loss_sum), "grad_norm": norm}
        if f"agent_{a}" in self.schedulers:
            self.schedulers[f"agent_{a}"].step()
        stats.update(kl_turn_stats(kl_by_turn, args.reference_kl_coef))
        return stats

    def _loss(
        self,
        a: int,
        chunk: list[Sample],
        logprobs: torch.Tensor,
        batch: TokenBatch,
        num_samples: int,
        total_tokens: int,
        ref_logprobs: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """This chunk's share of agent ``a``'s step loss (its rows' ``logprobs``), scaled so that
        chunking changes nothing."""
        agent, args = self.agents[a], self.args
        mask = batch.completion_mask
        advantages = torch.tensor([s.advantage for s in chunk], device=agent.device)
        if args.loss_aggregation == "sequence_sum":
            weight = len(chunk) / num_samples
        else:  # the chunk's completion tokens, counted on the host (mask.sum() would wait)
            weight = sum(len(s.completion_ids) for s in chunk) / max(total_tokens, 1)
        loss = policy_gradient_loss(logprobs, mask, advantages, args.loss_aggregation) * weight
        if self.reference_models is None:
            return loss, None
        if ref_logprobs is None:
            kl = reference_kl(self.reference_models[a], batch, logprobs)
        else:  # already read (a joint pass of a shared base)
            kl = kl_k3(logprobs, ref_logprobs, mask)
        loss = loss + args.reference_kl_coef * kl.mean() * (len(chunk) / num_samples)
        return loss, kl.detach()

    # -- saving ---------------------------------------------------------------------------------
    def checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, object]]:
        """The trainable models and their optimizers, by checkpoint name."""
        models = checkpoint_models(self.agents)
        optimizers = {f"agent_{i}": opt for i, opt in enumerate(self.optimizers)}
        return models, optimizers

    def apply_learning_rates(self) -> None:
        """Set every group to the config's learning rate: a resumed optimizer brings its saved
        lr, and the config (possibly changed for the resume) must win (see schedules.py)."""
        for i, optimizer in enumerate(self.optimizers):
            lrs = [self.args.agent_learning_rate] * len(optimizer.param_groups)
            apply_learning_rates(optimizer, self.schedulers.get(f"agent_{i}"), lrs)
