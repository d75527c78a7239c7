"""``IACTrainer`` and ``MAACTrainer``: actor-critic learners over ``CoMLRLEnv`` (SPEC §5, §7).

One round: roll out ``rollout_buffer_size`` task items through the env (``collect_tree``: one
batched generate per agent and turn, one reward call per item and turn), read ``V(s_t)`` for every
state from the critics in batched no-grad forwards, turn the rewards into GAE advantages and
returns over each episode's chain of turns, then per minibatch of items: one optimizer step per
actor and one per critic (optionally several PPO-clipped epochs).

Episodes become chains of turns as :mod:`cmlrl_agents.actor_critic_rollouts` documents.

IAC gives agent i its own critic ``V_i(prompt_i)``: a separate LM per agent, or a value head on
the actor's trunk trained through the actor's optimizer. MAAC has ONE critic over the joint
transcript (``EpisodeState.transcript()``, what ``env.state()`` returns), stepped once per
minibatch for the whole team, i.e. once per round with the default ``train_batch_size=None`` and
``ppo_epochs=1`` (the reference stepped it once per agent on the same data, B13).

``metrics_callback(rollouts)`` gets the round's :class:`RolloutSample` list once per round; its
values are logged at once, at that round's env_step, whatever ``logging_steps`` is (SPEC §7). In
evaluation it runs once per evaluated item and its values are averaged over items under
``eval/``. A NaN or infinite value raises, naming the callback.

With ``reference_kl_enabled`` each actor's loss gains ``reference_kl_coef`` times the k3 KL
estimate to a frozen copy of its initial weights, as in the MAGRPO family.
``explained_variance`` (stable-baselines3's) is omitted from a round whose returns are all equal,
where it is undefined (NaN would poison the averaged log entry).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset, IterableDataset

from cmlrl_agents._checks import finite_metrics
from cmlrl_agents.actor_critic_checks import check_critic_args, critic_names
from cmlrl_agents.actor_critic_config import ActorCriticConfig, IACConfig, MAACConfig
from cmlrl_agents.actor_critic_rollouts import (
    RolloutSample,
    StateKey,
    agent_rollouts,
    chain_gae,
    normalized,
    value_metrics,
)
from cmlrl_agents.devices import resolve_devices
from cmlrl_agents.losses import kl_k3, policy_gradient_loss, value_loss
from cmlrl_agents.magrpo import _frozen_copy, _kl_turn_means
from cmlrl_agents.optim import clip_and_step, make_adamw
from cmlrl_agents.policy import LLMAgent
from cmlrl_agents.rollout import RolloutTree, collect_tree
from cmlrl_agents.team import build_agents
from cmlrl_agents.tokens import TokenBatch, build_batch, sequence_logprobs
from cmlrl_agents.trainer_base import Item, TeamTrainer, turn_metrics
from cmlrl_agents.value_head import ValueModel
from cmlrl_env import CoMLRLEnv
from cmlrl_env.core import EpisodeState

__all__ = ["IACTrainer", "MAACTrainer", "RolloutSample", "chain_gae"]


class _ActorCriticTrainer(TeamTrainer):
    """What IAC and MAAC share; they differ in which critic reads which text."""

    config_class: type[ActorCriticConfig] = ActorCriticConfig
    centralized = False
    """True: one critic for the team over the joint transcript (MAAC)."""
    fixed_fields = (
        *TeamTrainer.fixed_fields,
        *("critic_devices", "value_head_hidden_dim", "critic_type", "reference_kl_enabled"),
    )

    def __init__(
        self,
        agent_model: Any = None,
        agents: Sequence[Any] | None = None,
        num_agents: int | None = None,
        tokenizer: Any = None,
        model_config: Mapping[str, Any] | None = None,
        train_dataset: Dataset | IterableDataset | None = None,
        eval_dataset: Dataset | IterableDataset | None = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        external_transition: Callable[..., Any] | None = None,
        wandb_config: Mapping[str, Any] | None = None,
        args: ActorCriticConfig | None = None,
        env: CoMLRLEnv | None = None,
        *,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
        metrics_callback: Callable[[list[RolloutSample]], Mapping[str, float]] | None = None,
    ) -> None:
        args = self.config_class() if args is None else args
        if not isinstance(args, self.config_class):
            raise TypeError(
                f"args must be a {self.config_class.__name__}, got {type(args).__name__}."
            )
        if metrics_callback is not None and not callable(metrics_callback):
            raise TypeError(
                f"metrics_callback must be callable(rollouts) -> dict[str, float], "
                f"got {metrics_callback!r}."
            )
        team = self.team_size(args, num_agents, agents, formatters, env)
        count = check_critic_args(self, args, critic_model, critics, team)
        super().__init__(
            args=args,
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            external_transition=external_transition,
            env=env,
            wandb_config=wandb_config,
            extra_config={"critic_models": critic_names(critic_model, critics, count)},
        )
        self._critic_names: list[str] = self.logger.config["critic_models"]
        self.metrics_callback = metrics_callback
        # Copied before any value head is attached to an actor: the reference is the policy only.
        ref_devices = resolve_devices(args.reference_devices, self.num_agents, "reference_devices")
        self.reference_models = (
            [
                _frozen_copy(agent.model, None if ref_devices is None else ref_devices[i])
                for i, agent in enumerate(self.agents)
            ]
            if args.reference_kl_enabled
            else None
        )
        self.critics: list[ValueModel]
        self.critic_encoders: list[LLMAgent]  # tokenizer (and chat template) of each critic
        self.critics, self.critic_encoders = self._build_critics(
            critic_model, critics, tokenizer, model_config
        )
        # A head on the actor is trained by the actor's optimizer (its own lr group): both
        # losses move the shared trunk, so one step must see both gradients.
        self.optimizers = [self._actor_optimizer(a) for a in range(self.num_agents)]
        self.critic_optimizers = [
            make_adamw([{"params": c.own_parameters()}], args.critic_lr, f"critics[{i}]")
            for i, c in enumerate(self.critics)
            if not c.shared
        ]

    def _actor_optimizer(self, a: int) -> torch.optim.Optimizer:
        params = [p for p in self.agents[a].model.parameters() if p.requires_grad]
        groups: list[dict[str, Any]] = [{"params": params}]
        critic = self.critics[self._critic_index(a)]
        if critic.shared:
            groups.append({"params": critic.own_parameters(), "lr": self.args.critic_lr})
        return make_adamw(groups, self.args.agent_learning_rate, f"agents[{a}]")

    # -- critics: which one serves which agent and reads what ----------------------------------
    def _build_critics(
        self,
        critic_model: Any,
        critics: Sequence[Any] | None,
        tokenizer: Any,
        model_config: Mapping[str, Any] | None,
    ) -> tuple[list[ValueModel], list[LLMAgent]]:
        # check_critic_args has vetted the arguments before any model was loaded.
        if critic_model is not None or critics is not None:
            count = 1 if self.centralized else self.num_agents
            return self._load_critics(critic_model, critics, count, tokenizer, model_config)
        hidden = self.args.value_head_hidden_dim
        return (
            [ValueModel(agent.model, shared=True, head_hidden_dim=hidden) for agent in self.agents],
            list(self.agents),
        )

    def _critic_index(self, agent: int) -> int:
        return 0 if self.centralized else agent

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

    def _load_critics(
        self,
        critic_model: Any,
        critics: Sequence[Any] | None,
        count: int,
        tokenizer: Any,
        model_config: Mapping[str, Any] | None,
    ) -> tuple[list[ValueModel], list[LLMAgent]]:
        if critic_model is not None and not isinstance(critic_model, str):
            critics, critic_model = [critic_model], None  # count is 1 (checked)
        if isinstance(tokenizer, (list, tuple)) and len(tokenizer) != count:
            tokenizer = tokenizer[0]  # the team's tokenizers differ only per agent
        if critic_model is not None or all(isinstance(c, str) for c in critics or ()):
            # A critic given by name or folder reads with the tokenizer saved beside it, not the
            # actors' (its vocabulary and chat template may differ).
            tokenizer = None
        encoders = build_agents(
            agent_model=critic_model,
            agents=critics,
            tokenizer=tokenizer,
            num_agents=count,
            model_config=model_config,
            devices=self._critic_devices(count),
            devices_field="critic_devices",
        )
        hidden = self.args.value_head_hidden_dim
        return [ValueModel(e.model, head_hidden_dim=hidden) for e in encoders], encoders

    def _critic_devices(self, count: int) -> list[torch.device] | None:
        """``critic_devices``; without it, beside the agent each critic serves when the agents
        were placed by ``agent_devices`` (else where ``model_config`` puts models)."""
        devices = resolve_devices(self.args.critic_devices, count, "critic_devices", "critic")
        if devices is None and self.args.agent_devices is not None:
            devices = [self.agents[self._critic_agent(c)].device for c in range(count)]
        return devices

    def _identity(self) -> dict[str, Any]:
        return {**super()._identity(), "critic_models": self._critic_names}

    def _apply_learning_rates(self) -> None:
        """Actors at ``agent_learning_rate``, critics (heads included) at ``critic_lr``."""
        args = self.args
        for optimizer in self.optimizers:
            optimizer.param_groups[0]["lr"] = args.agent_learning_rate
            for group in optimizer.param_groups[1:]:  # a value head on the actor
                group["lr"] = args.critic_lr
        for optimizer in self.critic_optimizers:
            for group in optimizer.param_groups:
                group["lr"] = args.critic_lr

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Evaluate the first ``args.eval_num_samples`` eval items, one response per agent per
        turn; ``{}`` without an eval dataset (set ``args.eval_num_samples`` to change it)."""
        return self.evaluate_items(self.args.eval_num_samples)

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        if self.metrics_callback is None:
            return {}
        per_item: dict[str, list[float]] = defaultdict(list)
        for tree in trees:
            samples = [s for agent in self._rollouts(tree, normalize=False) for s in agent]
            for slot in range(len(tree.items)):
                item_samples = [s for s in samples if s.item_slot == slot]
                for key, value in self._run_callback(item_samples).items():
                    per_item[key].append(value)
        return {key: float(np.mean(values)) for key, values in per_item.items()}

    def _run_callback(self, samples: list[RolloutSample]) -> dict[str, float]:
        assert self.metrics_callback is not None
        out = self.metrics_callback(samples)
        return finite_metrics(out, "metrics_callback")

    # -- rollouts ---------------------------------------------------------------------------------
    def _items_per_batch(self) -> int:
        return self.args.rollout_buffer_size

    def _critic_inputs(self, tree: RolloutTree) -> list[dict[StateKey, list[int]]]:
        """Token ids each critic reads for each state of the tree."""
        inputs: list[dict[StateKey, list[int]]] = []
        for c, encoder in enumerate(self.critic_encoders):
            agent = self._critic_agent(c)
            keys = [(t, b) for t, level in enumerate(tree.levels) for b in range(len(level.states))]
            texts = [self._critic_text(tree.levels[t].states[b], agent) for t, b in keys]
            inputs.append(dict(zip(keys, encoder.encode_prompts(texts), strict=True)))
        return inputs

    def _rollouts(
        self,
        tree: RolloutTree,
        *,
        normalize: bool,
        inputs: list[dict[StateKey, list[int]]] | None = None,
    ) -> list[list[RolloutSample]]:
        """Per agent: its samples with values, GAE advantages and returns."""
        inputs = self._critic_inputs(tree) if inputs is None else inputs
        args, per_critic = self.args, []
        for c, critic in enumerate(self.critics):
            flat = critic.values(
                list(inputs[c].values()),
                self.critic_encoders[c].pad_token_id,
                batch_size=args.forward_batch_size,
            ).cpu()
            sizes = [len(level.states) for level in tree.levels]
            values = list(flat.split(sizes))
            per_critic.append((values, *chain_gae(tree, values, args.discount, args.gae_lambda)))
        samples = [
            agent_rollouts(tree, a, *per_critic[self._critic_index(a)])
            for a in range(self.num_agents)
        ]
        if normalize:
            samples = [normalized(agent_samples) for agent_samples in samples]
        return samples

    # -- one round ----------------------------------------------------------------------------
    def _train_batch(self, items: list[Item]) -> tuple[dict[str, float], int]:
        args = self.args
        tree = collect_tree(
            self.task,
            self.agents,
            items,
            num_generations=args.num_generations,
            sampling=self.sampling,
        )
        inputs = self._critic_inputs(tree)
        samples = self._rollouts(tree, normalize=args.advantage_normalization, inputs=inputs)
        metrics = turn_metrics(tree, tree.returns(args.discount))
        metrics.update(self._value_metrics(samples))
        old = (
            [self._old_logprobs(a, samples[a]) for a in range(self.num_agents)]
            if args.ppo_clip_range is not None
            else None
        )
        metrics.update(self._update(samples, inputs, old))
        if self.metrics_callback is not None:
            extra = self._run_callback([s for agent in samples for s in agent])
            clash = sorted(set(extra) & set(metrics))
            if clash:
                raise ValueError(
                    f"metrics_callback returned {clash}, which the trainer logs "
                    "itself; rename those keys."
                )
            # At rollout collection, not held back (or averaged) by the logging_steps gap.
            self.logger.log_now(extra, self.env_step + tree.env_steps)
        metrics.update(_kl_turn_means(metrics, self.num_agents))
        return metrics, tree.env_steps

    def _critic_agent(self, c: int) -> int:
        """The first agent critic ``c`` serves (MAAC: all share its values and targets)."""
        return next(a for a in range(self.num_agents) if self._critic_index(a) == c)

    def _critic_rows(self, c: int, samples: list[list[RolloutSample]]) -> list[RolloutSample]:
        return samples[self._critic_agent(c)]

    def _value_metrics(self, samples: list[list[RolloutSample]]) -> dict[str, float]:
        return value_metrics(
            {
                self._critic_prefix(c): self._critic_rows(c, samples)
                for c in range(len(self.critics))
            }
        )

    def _old_logprobs(self, a: int, samples: list[RolloutSample]) -> list[torch.Tensor]:
        """Per sample, its completion tokens' log-probs before the update (PPO's old policy)."""
        agent, out = self.agents[a], []
        size = self.args.forward_batch_size or len(samples)
        agent.model.train()  # the mode the update scores in, so the first ratio is exactly 1
        with torch.no_grad():
            for start in range(0, len(samples), size):
                chunk = samples[start : start + size]
                batch = _batch(agent, chunk)
                lp = sequence_logprobs(agent.model, batch).cpu()
                mask = batch.completion_mask.bool().cpu()
                out.extend(row[m] for row, m in zip(lp, mask, strict=True))
        return out

    def _update(
        self,
        samples: list[list[RolloutSample]],
        inputs: list[dict[StateKey, list[int]]],
        old: list[list[torch.Tensor]] | None,
    ) -> dict[str, float]:
        stats: dict[str, list[float]] = defaultdict(list)
        slots = sorted({s.item_slot for s in samples[0]})
        per_step = self.args.items_per_step
        for _ in range(self.args.ppo_epochs):
            for i in range(0, len(slots), per_step):
                chosen = set(slots[i : i + per_step])
                for a in range(self.num_agents):
                    idx = [k for k, s in enumerate(samples[a]) if s.item_slot in chosen]
                    for key, value in self._actor_step(a, samples[a], idx, old).items():
                        stats[f"agent_{a}/{key}"].append(value)
                for c, critic in enumerate(self.critics):
                    if critic.shared:
                        continue
                    rows = [s for s in self._critic_rows(c, samples) if s.item_slot in chosen]
                    for key, value in self._critic_step(c, rows, inputs[c]).items():
                        stats[self._critic_metric(c, key)].append(value)
        return {key: float(np.mean(values)) for key, values in stats.items()}

    def _actor_step(
        self,
        a: int,
        samples: list[RolloutSample],
        idx: list[int],
        old: list[list[torch.Tensor]] | None,
    ) -> dict[str, float]:
        """One optimizer step of actor ``a`` (and of its value head when shared)."""
        agent, optimizer, args = self.agents[a], self.optimizers[a], self.args
        critic = self.critics[self._critic_index(a)]
        agent.model.train()
        optimizer.zero_grad(set_to_none=True)
        size = args.forward_batch_size or len(idx)
        sums: dict[str, float] = defaultdict(float)
        kl_by_turn: dict[int, list[float]] = defaultdict(list)
        for start in range(0, len(idx), size):
            chunk = idx[start : start + size]
            weight = len(chunk) / len(idx)
            losses = self._chunk_losses(
                agent,
                critic,
                [samples[k] for k in chunk],
                None if old is None else [old[a][k] for k in chunk],
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
        for turn, values in kl_by_turn.items():
            mean = sum(values) / len(values)
            sums[f"turn_{turn}/reference_kl_mean"] = mean
            sums[f"turn_{turn}/reference_kl_penalty_mean"] = args.reference_kl_coef * mean
        return dict(sums)

    def _chunk_losses(
        self,
        agent: LLMAgent,
        critic: ValueModel,
        chunk: list[RolloutSample],
        old: list[torch.Tensor] | None,
    ) -> dict[str, torch.Tensor]:
        args = self.args
        batch = _batch(agent, chunk)
        device = agent.device
        if critic.shared and critic.model is agent.model:
            # The value head reads the trunk during this very scoring forward.
            with critic.capture() as captured:
                logprobs = sequence_logprobs(agent.model, batch)
            positions = torch.tensor([len(s.prompt_ids) - 1 for s in chunk])
            values = captured.values(positions)
        else:
            logprobs, values = sequence_logprobs(agent.model, batch), None
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
                logprobs, mask, adv, "sequence_sum", old_lp, args.ppo_clip_range
            )
        }
        if values is not None:
            out["value_loss"] = self._value_loss(values, chunk)
        if self.reference_models is not None:
            reference = self.reference_models[self.agents.index(agent)]
            with torch.no_grad():
                ref_device = next(reference.parameters()).device
                ref = sequence_logprobs(reference, batch.to(ref_device)).to(device)
            out["reference_kl"] = kl_k3(logprobs, ref, mask)
        return out

    def _value_loss(self, values: torch.Tensor, rows: list[RolloutSample]) -> torch.Tensor:
        targets = torch.tensor([s.returns for s in rows], device=values.device)
        clip = self.args.value_clip_range
        old = None if clip is None else torch.tensor([s.value for s in rows], device=values.device)
        return value_loss(values, targets, old, clip)

    def _critic_step(
        self, c: int, rows: list[RolloutSample], inputs: dict[StateKey, list[int]]
    ) -> dict[str, float]:
        """One optimizer step of a separate critic over ``rows``; each state is read once."""
        # Critics are all separate or all heads on actors, so the indices line up.
        critic, encoder, optimizer = (
            self.critics[c],
            self.critic_encoders[c],
            self.critic_optimizers[c],
        )
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
        return {"value_loss": loss_sum, "grad_norm": grad_norm}

    # -- saving -------------------------------------------------------------------------------
    def _checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
        """The agents' parts plus ``critic_i`` (a shared critic is its head alone; the head's
        optimizer state is in its actor's optimizer)."""
        models, optimizers = super()._checkpoint_parts()
        models.update({f"critic_{c}": critic for c, critic in enumerate(self.critics)})
        optimizers.update({f"critic_{c}": opt for c, opt in enumerate(self.critic_optimizers)})
        return models, optimizers

    def save_model(self, output_dir: str | Path) -> None:
        """``agent_i/`` per actor (see TeamTrainer) and the critics under ``critic/``."""
        super().save_model(output_dir)
        for c, (critic, encoder) in enumerate(zip(self.critics, self.critic_encoders, strict=True)):
            folder = Path(output_dir) / "critic"
            if len(self.critics) > 1:
                folder = folder / f"agent_{c}"
            critic.save(folder, tokenizer=encoder.tokenizer)


class IACTrainer(_ActorCriticTrainer):
    """Independent actor-critic: agent i's critic reads agent i's prompt (SPEC §5).

    ``use_separate_critic=True`` (default) needs ``critic_model="<name or folder>"`` (one copy
    per agent) or ``critics=[model, ...]`` (one per agent; models use ``tokenizer=`` like the
    agents, or pass ``LLMAgent(model, its_tokenizer)``). ``False`` puts a value head on each actor.
    """

    algorithm = "iac"
    config_class = IACConfig
    centralized = False
    fixed_fields = (*_ActorCriticTrainer.fixed_fields, "use_separate_critic")


class MAACTrainer(_ActorCriticTrainer):
    """Multi-agent actor-critic with one centralised critic over the joint transcript.

    Needs ``critic_model="<name or folder>"`` or ``critics=[model]`` (exactly one).
    """

    algorithm = "maac"
    config_class = MAACConfig
    centralized = True


def _batch(agent: LLMAgent, samples: Sequence[RolloutSample]) -> TokenBatch:
    return build_batch(
        [s.prompt_ids for s in samples], [s.completion_ids for s in samples], agent.pad_token_id
    ).to(agent.device)
