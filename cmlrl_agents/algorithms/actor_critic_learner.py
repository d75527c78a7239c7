"""The actor-critic learner of IAC and MAAC: critic values, GAE, and the actor and critic steps.

``ActorCriticLearner.batch(tree)`` reads ``V(s_t)`` for every state of one round's rollout tree
from the critics in batched no-grad forwards and turns the rewards into GAE advantages and returns
over each episode's chain of turns (:func:`~cmlrl_agents.learning.credit.chain_credit`);
``update(batch)`` then gives, per minibatch of items (``items_per_step``) and PPO epoch, one
optimizer step per actor group and one per separate critic, all through the one engine
(:mod:`cmlrl_agents.learning.engine`), and returns the round's metrics.

IAC gives agent i its own critic ``V_i(prompt_i)``: a separate LM per agent, or a value head on
the actor's trunk trained through the actor's optimizer. MAAC has ONE critic over the joint
transcript (``EpisodeState.transcript()``, what ``env.state()`` returns), stepped once per
minibatch for the whole team (the reference stepped it once per agent on the same data, B13).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from cmlrl_agents.algorithms.actor_critic_config import ActorCriticConfig
from cmlrl_agents.algorithms.actor_critic_losses import CriticInputs, critic_plan
from cmlrl_agents.algorithms.actor_critic_rollouts import (
    RolloutSample,
    agent_rollouts,
    normalized,
    value_metrics,
)
from cmlrl_agents.foundation.distributed import data_parallel
from cmlrl_agents.foundation.metrics import kl_turn_means
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.learning.batch import PolicyRow, Windows, check_windows
from cmlrl_agents.learning.credit import chain_credit, joint_returns, round_metrics
from cmlrl_agents.learning.engine import StepEngine
from cmlrl_agents.learning.optim import AdamWOptions, make_adamw, refuse_shared_parameters
from cmlrl_agents.learning.policy_loss import PolicyObjective
from cmlrl_agents.learning.policy_round import PolicyLearner
from cmlrl_agents.policies.adapters import checkpoint_models
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.value_head import ValueModel
from cmlrl_env.core import EpisodeState

__all__ = ["ActorCriticBatch", "ActorCriticLearner"]


@dataclass(frozen=True)
class ActorCriticBatch:
    """One round as the learner trains on it (its tree read once, by ``batch``)."""

    windows: Windows
    """The item slots of each optimizer step of one pass over the round (``batch.Windows``)."""
    metrics: Mapping[str, float]
    """Reward, return and completion metrics of the round (this process's share)."""
    inputs: list[CriticInputs]
    """Per critic: the token ids it reads for each state of the tree."""
    samples: list[list[RolloutSample]]
    """Per agent: its samples with values, GAE advantages and returns."""

    def __post_init__(self) -> None:
        check_windows(self.windows, {s.item_slot for agent in self.samples for s in agent})

    @property
    def rows(self) -> tuple[PolicyRow, ...]:
        """Every agent's samples as policy rows (agent-major)."""
        return tuple(s.row() for agent in self.samples for s in agent)


class ActorCriticLearner(PolicyLearner[ActorCriticConfig]):
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
        num_turns: int,
    ) -> None:
        self.agents, self.critics = list(agents), list(critics)
        self.critic_encoders = list(critic_encoders)  # tokenizer (and chat template) per critic
        self.args, self.centralized = args, centralized
        self.reference_models = reference_models
        self.num_turns = num_turns
        self.parallel = data_parallel()
        self.parallel.broadcast_parameters([*(a.model for a in self.agents), *self.critics])
        self.engine = StepEngine(self.parallel, bf16=args.bf16)
        # A head on the actor is trained by the actor's optimizer (its own lr group): both
        # losses move the shared trunk, so one step must see both gradients.
        self.optimizers = [self._actor_optimizer(a) for a in range(len(self.agents))]
        self.critic_optimizers = [
            make_adamw(
                [{"params": c.own_parameters()}],
                args.critic_lr,
                f"critics[{i}]",
                AdamWOptions.of(args),
            )
            for i, c in enumerate(self.critics)
            if not c.shared
        ]
        refuse_shared_parameters(self.named_optimizers())
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}
        """Per optimizer (``agent_i``, ``critic_c``), when the config asks for a schedule."""

    def _actor_optimizer(self, a: int) -> torch.optim.Optimizer:
        params = self.agents[a].trainable_parameters()
        groups: list[dict[str, Any]] = [{"params": params}]
        critic = self.critics[self.critic_index(a)]
        if critic.shared:
            groups.append({"params": critic.own_parameters(), "lr": self.args.critic_lr})
        return make_adamw(
            groups, self.args.agent_learning_rate, f"agents[{a}]", AdamWOptions.of(self.args)
        )

    def named_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        named = {f"agent_{i}": o for i, o in enumerate(self.optimizers)}
        named.update({f"critic_{c}": o for c, o in enumerate(self.critic_optimizers)})
        return named

    def learning_rates(self, name: str) -> list[float]:
        """Actors at ``agent_learning_rate`` (a value head's group at ``critic_lr``), critics
        at ``critic_lr``."""
        groups = len(self.named_optimizers()[name].param_groups)
        if name.startswith("critic_"):
            return [self.args.critic_lr] * groups
        return [self.args.agent_learning_rate] + [self.args.critic_lr] * (groups - 1)

    def steps_per_round(self, items: int) -> int:
        return self.args.ppo_epochs * -(-items // self.args.items_per_step)

    def objective(self) -> PolicyObjective:
        """The actors' loss settings of the current config (a value head's loss included)."""
        args, refs = self.args, self.reference_models
        return PolicyObjective.of(
            args,
            len(self.agents),
            kl_coef=None if refs is None else args.reference_kl_coef,
            clip_range=args.ppo_clip_range,
            aggregation="sequence_sum",
            value_loss_coef=args.value_loss_coef,
            value_clip_range=args.value_clip_range,
        )

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
            credit = chain_credit(tree, values, args.discount, args.gae_lambda)
            per_critic.append((values, *credit))
        samples = [
            agent_rollouts(tree, a, *per_critic[self.critic_index(a)])
            for a in range(len(self.agents))
        ]
        if normalize:
            samples = [normalized(agent_samples, self.parallel) for agent_samples in samples]
        return samples

    def batch(self, tree: RolloutTree) -> ActorCriticBatch:
        """The round's critic inputs and samples (advantages normalized as the config says)."""
        inputs = self.critic_inputs(tree)
        samples = self.rollouts(tree, normalize=self.args.advantage_normalization, inputs=inputs)
        metrics = round_metrics(tree, joint_returns(tree, self.args.discount))
        return ActorCriticBatch(
            windows=self.windows(len(tree.items)),
            metrics=metrics,
            inputs=inputs,
            samples=samples,
        )

    # -- the update -----------------------------------------------------------------------------
    def update(self, batch: ActorCriticBatch) -> dict[str, float]:
        """Every actor's and separate critic's steps on ``batch``; the round's metrics."""
        metrics = dict(batch.metrics)
        metrics.update(self._value_metrics(batch.samples))
        # The actor-critics' name for the policy term (their value loss is apart).
        policy = self.policy_round(
            batch.rows,
            batch.windows,
            self.objective(),
            self.args.ppo_epochs,
            loss_key="policy_loss",
        )
        for s, slots in enumerate(policy.steps):
            for group in policy.groups:
                heads = [self._head_on_actor(a) for a in group]
                policy.step(s, group, heads if any(h is not None for h in heads) else None)
            self._critic_steps(batch, slots, policy.per_step)
        metrics.update(policy.metrics())
        metrics.update(kl_turn_means(metrics, len(self.agents), self.num_turns))
        return metrics

    def _critic_steps(
        self, batch: ActorCriticBatch, chosen: Collection[int], per_step: dict[str, list[float]]
    ) -> None:
        for c, critic in enumerate(self.critics):
            if critic.shared:
                continue
            rows = [s for s in batch.samples[self.critic_agent(c)] if s.item_slot in chosen]
            name = f"critic_{c}"
            plan = critic_plan(
                name,
                critic,
                self.critic_optimizers[c],
                rows,
                batch.inputs[c],
                self.critic_encoders[c].pad_token_id,
                self.args,
            )
            result = self.engine.step(
                plan, max_grad_norm=self.args.max_grad_norm, schedulers=self.schedulers
            )
            per_step[self._critic_metric(c, "value_loss")].append(
                result.stats[f"{name}/value_loss"]
            )
            per_step[self._critic_metric(c, "grad_norm")].append(result.stats[f"{name}/grad_norm"])

    def _value_metrics(self, samples: list[list[RolloutSample]]) -> dict[str, float]:
        """Value means and explained variances over the whole round (every rank's share)."""
        count = len(self.critics)
        mine = {self._critic_prefix(c): samples[self.critic_agent(c)] for c in range(count)}
        rows = {key: [(s.value, s.returns) for s in rows] for key, rows in mine.items()}
        merged: dict[str, list[tuple[float, float]]] = {key: [] for key in rows}
        for rank_rows in self.parallel.gather(rows):
            for key, pairs in rank_rows.items():
                merged[key].extend(pairs)
        return value_metrics(merged)

    def _head_on_actor(self, a: int) -> ValueModel | None:
        critic = self.critics[self.critic_index(a)]
        return critic if critic.shared and critic.model is self.agents[a].model else None

    # -- saving ---------------------------------------------------------------------------------
    def checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
        """``agent_i`` and ``critic_i`` (a shared critic is its head alone; the head's optimizer
        state is in its actor's optimizer)."""
        models: dict[str, torch.nn.Module] = checkpoint_models(self.agents)
        models.update({f"critic_{c}": critic for c, critic in enumerate(self.critics)})
        return models, dict(self.named_optimizers())
