"""The actor-critic learner of IAC and MAAC: critic values, GAE, and the actor and critic steps.

``ActorCriticLearner.batch(tree)`` reads ``V(s_t)`` for every state of one round's rollout tree
from the critics in batched no-grad forwards and turns the rewards into GAE advantages and returns
over each episode's chain of turns (:mod:`cmlrl_agents.algorithms.actor_critic_rollouts`);
``update(batch)`` then gives, per minibatch of items, one optimizer step per actor and one per
separate critic (optionally several PPO-clipped epochs) and returns the round's metrics.

IAC gives agent i its own critic ``V_i(prompt_i)``: a separate LM per agent, or a value head on
the actor's trunk trained through the actor's optimizer. MAAC has ONE critic over the joint
transcript (``EpisodeState.transcript()``, what ``env.state()`` returns), stepped once per
minibatch for the whole team (the reference stepped it once per agent on the same data, B13).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cmlrl_agents.algorithms.actor_critic_config import ActorCriticConfig
from cmlrl_agents.algorithms.actor_critic_losses import (
    actor_losses,
    host_stats,
    sample_value_loss,
)
from cmlrl_agents.algorithms.actor_critic_rollouts import (
    RolloutSample,
    StateKey,
    agent_rollouts,
    chain_gae,
    normalized,
    value_metrics,
)
from cmlrl_agents.algorithms.optim import clip_and_step, make_adamw
from cmlrl_agents.algorithms.schedules import apply_learning_rates, make_schedulers, steps_per_round
from cmlrl_agents.policies.adapters import JointPass, checkpoint_models, joint_groups, joint_pass
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.reference import kl_turn_means, kl_turn_stats
from cmlrl_agents.policies.value_head import HeadCaptures, ValueModel
from cmlrl_agents.runs.metrics import turn_metrics
from cmlrl_agents.runs.rollout import RolloutTree
from cmlrl_env.core import EpisodeState

__all__ = ["ActorCriticBatch", "ActorCriticLearner"]

CriticInputs = dict[StateKey, list[int]]


@dataclass(frozen=True)
class ActorCriticBatch:
    """One round as the learner trains on it."""

    tree: RolloutTree
    inputs: list[CriticInputs]
    """Per critic: the token ids it reads for each state of the tree."""
    samples: list[list[RolloutSample]]
    """Per agent: its samples with values, GAE advantages and returns."""


class ActorCriticLearner:
    """Actors, critics and their optimizers; ``args`` is read at every update."""

    def __init__(
        self,
        agents: Sequence[LLMAgent],
        critics: Sequence[ValueModel],
        critic_encoders: Sequence[LLMAgent],
        args: ActorCriticConfig,
        *,
        centralized: bool,
        reference_models: list[Any] | None,
    ) -> None:
        self.agents, self.critics = list(agents), list(critics)
        self.critic_encoders = list(critic_encoders)  # tokenizer (and chat template) per critic
        self.args, self.centralized = args, centralized
        self.reference_models = reference_models
        # A head on the actor is trained by the actor's optimizer (its own lr group): both
        # losses move the shared trunk, so one step must see both gradients.
        self.optimizers = [self._actor_optimizer(a) for a in range(len(self.agents))]
        self.critic_optimizers = [
            make_adamw([{"params": c.own_parameters()}], args.critic_lr, f"critics[{i}]")
            for i, c in enumerate(self.critics)
            if not c.shared
        ]
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        """Per optimizer (``agent_i``, ``critic_c``), when the config asks for a schedule."""

    def schedule(self, rounds: Iterable[int] | None) -> None:
        """Build the learning-rate schedulers for a run of rounds of these item counts (None:
        unknown, a stream); once only, so a resumed schedule is not rebuilt."""
        if self.schedulers:
            return
        args = self.args
        total = (
            None
            if rounds is None
            else sum(steps_per_round(r, args.items_per_step, args.ppo_epochs) for r in rounds)
        )
        _, optimizers = self.checkpoint_parts()
        self.schedulers = make_schedulers(
            optimizers, args.lr_scheduler_type, args.warmup_steps, total
        )

    def _actor_optimizer(self, a: int) -> torch.optim.Optimizer:
        params = self.agents[a].trainable_parameters()
        groups: list[dict[str, Any]] = [{"params": params}]
        critic = self.critics[self.critic_index(a)]
        if critic.shared:
            groups.append({"params": critic.own_parameters(), "lr": self.args.critic_lr})
        return make_adamw(groups, self.args.agent_learning_rate, f"agents[{a}]")

    # -- which critic serves which agent and reads what -----------------------------------------
    def critic_index(self, agent: int) -> int:
        return 0 if self.centralized else agent

    def critic_agent(self, c: int) -> int:
        """The first agent critic ``c`` serves (MAAC: all share its values and targets)."""
        return next(a for a in range(len(self.agents)) if self.critic_index(a) == c)

    def _critic_text(self, state: EpisodeState, agent: int) -> str:
        """MAAC's critic reads the joint transcript (``env.state()``); IAC's its agent's prompt."""
        return state.transcript() if self.centralized else state.prompts[agent]

    def _critic_prefix(self, c: int) -> str:
        return "critic" if self.centralized else f"agent_{c}"

    def _critic_metric(self, c: int, key: str) -> str:
        """A separate critic's step metric; IAC's is ``agent_i/critic_grad_norm`` because
        ``agent_i/grad_norm`` is the actor's."""
        if self.centralized or key == "value_loss":
            return f"{self._critic_prefix(c)}/{key}"
        return f"agent_{c}/critic_{key}"

    # -- the batch ------------------------------------------------------------------------------
    def critic_inputs(self, tree: RolloutTree) -> list[CriticInputs]:
        """Token ids each critic reads for each state of the tree."""
        inputs: list[CriticInputs] = []
        for c, encoder in enumerate(self.critic_encoders):
            agent = self.critic_agent(c)
            keys = [(t, b) for t, level in enumerate(tree.levels) for b in range(len(level.states))]
            texts = [self._critic_text(tree.levels[t].states[b], agent) for t, b in keys]
            inputs.append(dict(zip(keys, encoder.encode_prompts(texts), strict=True)))
        return inputs

    def rollouts(
        self, tree: RolloutTree, *, normalize: bool, inputs: list[CriticInputs] | None = None
    ) -> list[list[RolloutSample]]:
        """Per agent: its samples with values, GAE advantages and returns."""
        inputs = self.critic_inputs(tree) if inputs is None else inputs
        args, per_critic = self.args, []
        for c, critic in enumerate(self.critics):
            if critic.shared:  # a head on an adapter agent reads through that agent's adapter
                self.agents[self.critic_agent(c)].activate()
            flat = critic.values(
                list(inputs[c].values()),
                self.critic_encoders[c].pad_token_id,
                batch_size=args.forward_batch_size,
            ).cpu()
            values = list(flat.split([len(level.states) for level in tree.levels]))
            per_critic.append((values, *chain_gae(tree, values, args.discount, args.gae_lambda)))
        samples = [
            agent_rollouts(tree, a, *per_critic[self.critic_index(a)])
            for a in range(len(self.agents))
        ]
        if normalize:
            samples = [normalized(agent_samples) for agent_samples in samples]
        return samples

    def batch(self, tree: RolloutTree) -> ActorCriticBatch:
        """The round's critic inputs and samples (advantages normalized as the config says)."""
        inputs = self.critic_inputs(tree)
        samples = self.rollouts(tree, normalize=self.args.advantage_normalization, inputs=inputs)
        return ActorCriticBatch(tree=tree, inputs=inputs, samples=samples)

    def actor_groups(self) -> list[list[int]]:
        """The actors that step together: adapter agents of one base without active dropout
        (``adapters.joint_groups``: one mixed-adapter pass for all of them), the others alone."""
        joint = joint_groups(self.agents)
        alone = [[a] for a in range(len(self.agents)) if not any(a in g for g in joint)]
        return sorted(joint + alone)

    def old_logprobs(self, samples: list[list[RolloutSample]]) -> list[list[torch.Tensor]]:
        """Per agent and sample (``samples[a]``): its completion tokens' log-probs before the
        update (PPO's old policy), on the agent's device, scored in the passes (and the mode)
        the update scores in, so the first ratio is exactly 1."""
        out: list[list[torch.Tensor]] = [[] for _ in self.agents]
        for group in self.actor_groups():
            flat = [(k, s) for k, a in enumerate(group) for s in samples[a]]
            size = self.args.forward_batch_size or max(len(flat), 1)
            for a in group:
                self.agents[a].model.train()
            with torch.no_grad():
                for start in range(0, len(flat), size):
                    chunk = flat[start : start + size]
                    scored = self._joint_pass(group, chunk, None)
                    mask = scored.batch.completion_mask.bool()
                    for (k, _), row, m in zip(chunk, scored.logprobs, mask, strict=True):
                        out[group[k]].append(row[m])
        return out

    def _joint_pass(
        self,
        group: list[int],
        chunk: Sequence[tuple[int, RolloutSample]],
        reference: Any,
        policy_context: Any = None,
    ) -> JointPass:
        return joint_pass(
            [self.agents[a] for a in group],
            [k for k, _ in chunk],
            [s.prompt_ids for _, s in chunk],
            [s.completion_ids for _, s in chunk],
            reference,
            policy_context=policy_context,
        )

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: ActorCriticBatch) -> dict[str, float]:
        """Every actor's and separate critic's steps on ``batch``; the round's metrics."""
        args, samples = self.args, batch.samples
        metrics = turn_metrics(batch.tree, batch.tree.returns(args.discount))
        metrics.update(self._value_metrics(samples))
        old = self.old_logprobs(samples) if args.ppo_clip_range is not None else None
        stats: dict[str, list[float]] = defaultdict(list)
        slots = sorted({s.item_slot for s in samples[0]})
        per_step = args.items_per_step
        for _ in range(args.ppo_epochs):
            for i in range(0, len(slots), per_step):
                self._minibatch_steps(batch, set(slots[i : i + per_step]), old, stats)
        metrics.update({key: float(np.mean(values)) for key, values in stats.items()})
        metrics.update(kl_turn_means(metrics, len(self.agents), self.args.num_turns))
        return metrics

    def _value_metrics(self, samples: list[list[RolloutSample]]) -> dict[str, float]:
        count = len(self.critics)
        return value_metrics(
            {self._critic_prefix(c): samples[self.critic_agent(c)] for c in range(count)}
        )

    def _minibatch_steps(
        self,
        batch: ActorCriticBatch,
        chosen: set[int],
        old: list[list[torch.Tensor]] | None,
        stats: dict[str, list[float]],
    ) -> None:
        samples = batch.samples
        for group in self.actor_groups():
            idx = [[k for k, s in enumerate(samples[a]) if s.item_slot in chosen] for a in group]
            for a, got in zip(group, self._actor_step(group, samples, idx, old), strict=True):
                for key, value in got.items():
                    stats[f"agent_{a}/{key}"].append(value)
        for c, critic in enumerate(self.critics):
            if critic.shared:
                continue
            rows = [s for s in samples[self.critic_agent(c)] if s.item_slot in chosen]
            for key, value in self._critic_step(c, rows, batch.inputs[c]).items():
                stats[self._critic_metric(c, key)].append(value)

    def _actor_step(
        self,
        group: list[int],
        samples: list[list[RolloutSample]],
        idx: list[list[int]],
        old: list[list[torch.Tensor]] | None,
    ) -> list[dict[str, float]]:
        """One optimizer step of each actor of ``group`` (and of its value head when shared)
        over its rows ``samples[group[k]][i]`` for ``i`` in ``idx[k]``, scored together
        (``adapters.joint_pass``): each loss is the one its agent has alone, and each adapter
        and head receives only its own gradient."""
        args = self.args
        for a in group:
            self.agents[a].model.train()
            self.optimizers[a].zero_grad(set_to_none=True)
        flat = [(k, i) for k, rows in enumerate(idx) for i in rows]
        size = args.forward_batch_size or max(len(flat), 1)
        # Statistics stay on the device until the step ends: one copy to the host per step.
        sums: list[dict[str, torch.Tensor]] = [{} for _ in group]
        kls: list[list[tuple[list[int], torch.Tensor]]] = [[] for _ in group]
        for start in range(0, len(flat), size):
            chunk = flat[start : start + size]
            self._chunk_loss(group, samples, idx, old, chunk, sums, kls).backward()
        out = []
        for k, a in enumerate(group):
            stats, kl_by_turn = host_stats(sums[k], kls[k])
            stats["grad_norm"] = clip_and_step(self.optimizers[a], args.max_grad_norm)
            if f"agent_{a}" in self.schedulers:
                self.schedulers[f"agent_{a}"].step()
            stats.update(kl_turn_stats(kl_by_turn, args.reference_kl_coef))
            out.append(stats)
        return out

    def _chunk_loss(
        self,
        group: list[int],
        samples: list[list[RolloutSample]],
        idx: list[list[int]],
        old: list[list[torch.Tensor]] | None,
        chunk: list[tuple[int, int]],
        sums: list[dict[str, torch.Tensor]],
        kls: list[list[tuple[list[int], torch.Tensor]]],
    ) -> torch.Tensor:
        """The group's summed, weighted losses of one chunk of rows (``(k, i)``: sample ``i``
        of agent ``group[k]``); each agent's loss statistics are added to ``sums[k]``."""
        args, refs = self.args, self.reference_models
        rows = [(k, samples[group[k]][i]) for k, i in chunk]
        # A value head on the actor reads the trunk during this very scoring forward.
        heads = HeadCaptures([self._head_on_actor(a) for a in group])
        scored = self._joint_pass(group, rows, None if refs is None else refs[group[0]], heads)
        device = scored.logprobs.device
        positions = torch.tensor([len(s.prompt_ids) - 1 for _, s in rows], device=device)
        total = scored.logprobs.new_zeros(())
        for k, a in enumerate(group):
            mine = scored.rows(k)
            if not mine:
                continue
            picked = [rows[r][1] for r in mine]
            # Alone (every row its own), the tensors are used as they are: no gathered copy.
            sel = slice(None) if len(mine) == len(rows) else torch.tensor(mine, device=device)
            captured = heads.captured[k]
            losses = actor_losses(
                picked, scored.logprobs[sel], scored.batch.completion_mask[sel], args,
                old=None if old is None else [old[a][chunk[r][1]] for r in mine],
                values=None if captured is None else captured.values(positions)[sel],
                ref_logprobs=None if scored.reference is None else scored.reference[sel],
            )  # fmt: skip
            part = losses["policy_loss"]
            if "value_loss" in losses:
                part = part + args.value_loss_coef * losses["value_loss"]
            kl = losses.pop("reference_kl", None)
            if kl is not None:
                part = part + args.reference_kl_coef * kl.mean()
                kls[k].append(([s.turn for s in picked], kl.detach()))
            weight = len(mine) / len(idx[k])
            total = total + part * weight
            for key, value in losses.items():
                sums[k][key] = sums[k].get(key, 0.0) + value.detach() * weight
        return total

    def _head_on_actor(self, a: int) -> ValueModel | None:
        critic = self.critics[self.critic_index(a)]
        return critic if critic.shared and critic.model is self.agents[a].model else None

    def _critic_step(
        self, c: int, rows: list[RolloutSample], inputs: CriticInputs
    ) -> dict[str, float]:
        """One optimizer step of a separate critic over ``rows``; each state is read once."""
        # Critics are all separate or all heads on actors, so the indices line up.
        critic, encoder = self.critics[c], self.critic_encoders[c]
        optimizer = self.critic_optimizers[c]
        critic.train()
        optimizer.zero_grad(set_to_none=True)
        keys = list(dict.fromkeys(s.state_key for s in rows))
        size = self.args.forward_batch_size or len(keys)
        losses: list[torch.Tensor] = []  # read once at the end: a read per chunk would wait
        for start in range(0, len(keys), size):
            local = {k: i for i, k in enumerate(keys[start : start + size])}
            chunk = [s for s in rows if s.state_key in local]
            state_values = critic.values(
                [inputs[k] for k in local], encoder.pad_token_id, grad=True
            )
            index = torch.tensor([local[s.state_key] for s in chunk], device=state_values.device)
            loss = sample_value_loss(state_values[index], chunk, self.args.value_clip_range) * (
                len(chunk) / len(rows)
            )
            (self.args.value_loss_coef * loss).backward()
            losses.append(loss.detach())
        grad_norm = clip_and_step(optimizer, self.args.max_grad_norm)
        if f"critic_{c}" in self.schedulers:
            self.schedulers[f"critic_{c}"].step()
        return {"value_loss": float(sum(losses)), "grad_norm": grad_norm}

    # -- saving ---------------------------------------------------------------------------------
    def checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
        """``agent_i`` and ``critic_i`` (a shared critic is its head alone; the head's optimizer
        state is in its actor's optimizer)."""
        models: dict[str, torch.nn.Module] = checkpoint_models(self.agents)
        optimizers: dict[str, Any] = {f"agent_{i}": o for i, o in enumerate(self.optimizers)}
        models.update({f"critic_{c}": critic for c, critic in enumerate(self.critics)})
        optimizers.update({f"critic_{c}": opt for c, opt in enumerate(self.critic_optimizers)})
        return models, optimizers

    def apply_learning_rates(self) -> None:
        """Actors at ``agent_learning_rate``, critics (heads included) at ``critic_lr``; the
        config wins over the lr a resumed optimizer brings."""
        args = self.args
        for a, optimizer in enumerate(self.optimizers):  # groups after the first: a value head
            lrs = [args.agent_learning_rate] + [args.critic_lr] * (len(optimizer.param_groups) - 1)
            apply_learning_rates(optimizer, self.schedulers.get(f"agent_{a}"), lrs)
        for c, optimizer in enumerate(self.critic_optimizers):
            lrs = [args.critic_lr] * len(optimizer.param_groups)
            apply_learning_rates(optimizer, self.schedulers.get(f"critic_{c}"), lrs)
