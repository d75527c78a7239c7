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
from cmlrl_agents.functional.losses import policy_gradient_loss, value_loss
from cmlrl_agents.policies.adapters import checkpoint_models
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.reference import kl_turn_means, kl_turn_stats, reference_kl
from cmlrl_agents.policies.tokens import TokenBatch, build_batch
from cmlrl_agents.policies.value_head import ValueModel
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

    def old_logprobs(self, a: int, samples: list[RolloutSample]) -> list[torch.Tensor]:
        """Per sample, its completion tokens' log-probs before the update (PPO's old policy)."""
        agent, out = self.agents[a], []
        size = self.args.forward_batch_size or len(samples)
        agent.model.train()  # the mode the update scores in, so the first ratio is exactly 1
        with torch.no_grad():
            for start in range(0, len(samples), size):
                batch = _token_batch(agent, samples[start : start + size])
                lp = agent.score(batch).cpu()
                mask = batch.completion_mask.bool().cpu()
                out.extend(row[m] for row, m in zip(lp, mask, strict=True))
        return out

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: ActorCriticBatch) -> dict[str, float]:
        """Every actor's and separate critic's steps on ``batch``; the round's metrics."""
        args, samples = self.args, batch.samples
        metrics = turn_metrics(batch.tree, batch.tree.returns(args.discount))
        metrics.update(self._value_metrics(samples))
        old = (
            [self.old_logprobs(a, samples[a]) for a in range(len(self.agents))]
            if args.ppo_clip_range is not None
            else None
        )
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
        for a in range(len(self.agents)):
            idx = [k for k, s in enumerate(samples[a]) if s.item_slot in chosen]
            for key, value in self._actor_step(a, samples[a], idx, old).items():
                stats[f"agent_{a}/{key}"].append(value)
        for c, critic in enumerate(self.critics):
            if critic.shared:
                continue
            rows = [s for s in samples[self.critic_agent(c)] if s.item_slot in chosen]
            for key, value in self._critic_step(c, rows, batch.inputs[c]).items():
                stats[self._critic_metric(c, key)].append(value)

    def _actor_step(
        self,
        a: int,
        samples: list[RolloutSample],
        idx: list[int],
        old: list[list[torch.Tensor]] | None,
    ) -> dict[str, float]:
        """One optimizer step of actor ``a`` (and of its value head when shared)."""
        agent, optimizer, args = self.agents[a], self.optimizers[a], self.args
        agent.model.train()
        optimizer.zero_grad(set_to_none=True)
        size = args.forward_batch_size or len(idx)
        sums: dict[str, float] = defaultdict(float)
        kl_by_turn: dict[int, list[float]] = defaultdict(list)
        for start in range(0, len(idx), size):
            chunk = idx[start : start + size]
            weight = len(chunk) / len(idx)
            losses = self._chunk_losses(
                a, [samples[k] for k in chunk], None if old is None else [old[a][k] for k in chunk]
            )
            total = losses["policy_loss"]
            if "value_loss" in losses:
                total = total + args.value_loss_coef * losses["value_loss"]
            kl = losses.pop("reference_kl", None)
            if kl is not None:
                total = total + args.reference_kl_coef * kl.mean()
                for k, value in zip(chunk, kl.detach().tolist(), strict=True):
                    kl_by_turn[samples[k].turn].append(value)
            (total * weight).backward()
            for key, value in losses.items():
                sums[key] += float(value.detach()) * weight
        sums["grad_norm"] = clip_and_step(optimizer, args.max_grad_norm)
        if f"agent_{a}" in self.schedulers:
            self.schedulers[f"agent_{a}"].step()
        sums.update(kl_turn_stats(kl_by_turn, args.reference_kl_coef))
        return dict(sums)

    def _chunk_losses(
        self, a: int, chunk: list[RolloutSample], old: list[torch.Tensor] | None
    ) -> dict[str, torch.Tensor]:
        agent, critic = self.agents[a], self.critics[self.critic_index(a)]
        batch = _token_batch(agent, chunk)
        device = agent.device
        if critic.shared and critic.model is agent.model:
            # The value head reads the trunk during this very scoring forward.
            with critic.capture() as captured:
                logprobs = agent.score(batch)
            values = captured.values(torch.tensor([len(s.prompt_ids) - 1 for s in chunk]))
        else:
            logprobs, values = agent.score(batch), None
        mask = batch.completion_mask
        old_lp = None
        if old is not None:
            old_lp = torch.zeros_like(logprobs)
            old_lp[mask.bool()] = torch.cat(old).to(device)
        adv = torch.tensor(
            [
                s.normalized_advantage if s.normalized_advantage is not None else s.advantage
                for s in chunk
            ],
            device=device,
        )
        out = {
            "policy_loss": policy_gradient_loss(
                logprobs, mask, adv, "sequence_sum", old_lp, self.args.ppo_clip_range
            )
        }
        if values is not None:
            out["value_loss"] = self._value_loss(values, chunk)
        if self.reference_models is not None:
            out["reference_kl"] = reference_kl(self.reference_models[a], batch, logprobs)
        return out

    def _value_loss(self, values: torch.Tensor, rows: list[RolloutSample]) -> torch.Tensor:
        targets = torch.tensor([s.returns for s in rows], device=values.device)
        clip = self.args.value_clip_range
        old = None if clip is None else torch.tensor([s.value for s in rows], device=values.device)
        return value_loss(values, targets, old, clip)

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
        loss_sum = 0.0
        for start in range(0, len(keys), size):
            local = {k: i for i, k in enumerate(keys[start : start + size])}
            chunk = [s for s in rows if s.state_key in local]
            state_values = critic.values(
                [inputs[k] for k in local], encoder.pad_token_id, grad=True
            )
            index = torch.tensor([local[s.state_key] for s in chunk], device=state_values.device)
            loss = self._value_loss(state_values[index], chunk) * (len(chunk) / len(rows))
            (self.args.value_loss_coef * loss).backward()
            loss_sum += float(loss.detach())
        grad_norm = clip_and_step(optimizer, self.args.max_grad_norm)
        if f"critic_{c}" in self.schedulers:
            self.schedulers[f"critic_{c}"].step()
        return {"value_loss": loss_sum, "grad_norm": grad_norm}

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


def _token_batch(agent: LLMAgent, samples: Sequence[RolloutSample]) -> TokenBatch:
    return build_batch(
        [s.prompt_ids for s in samples], [s.completion_ids for s in samples], agent.pad_token_id
    ).to(agent.device)
