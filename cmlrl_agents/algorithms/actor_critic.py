"""``IACTrainer`` and ``MAACTrainer``: the actor-critic loop over ``CoMLRLEnv`` (SPEC §5, §7).

One round: roll out ``rollout_buffer_size`` task items through the env (``collect_tree``: one
batched generate per agent and turn, one reward call per item and turn), then hand the tree to
the :class:`~cmlrl_agents.algorithms.actor_critic_learner.ActorCriticLearner` (``trainer.learner``):
``learner.batch(tree)`` reads the critics' values and computes GAE, ``learner.update(batch)``
steps the actors and critics (the learner's docstring says which critic reads which text).

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
from typing import Any, Unpack

import numpy as np
import torch

from cmlrl_agents._checks import finite_metrics
from cmlrl_agents.algorithms.actor_critic_checks import check_critic_args, critic_names
from cmlrl_agents.algorithms.actor_critic_config import (
    ActorCriticConfig,
    IACConfig,
    MAACConfig,
    check_chain_turns,
)
from cmlrl_agents.algorithms.actor_critic_learner import ActorCriticLearner
from cmlrl_agents.algorithms.actor_critic_rollouts import RolloutSample
from cmlrl_agents.foundation.distributed import aggregate_metrics
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.build import build_agents
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.model_setup import disable_dropout
from cmlrl_agents.policies.reference import reference_policies
from cmlrl_agents.policies.value_head import ValueModel
from cmlrl_agents.runs.round_trainer import RoundTrainer
from cmlrl_agents.runs.trainer_keywords import TeamKeywords, check_team_keywords
from cmlrl_agents.runs.trainer_setup import team_size

__all__ = ["IACTrainer", "MAACTrainer", "RolloutSample"]


class _ActorCriticTrainer(RoundTrainer[ActorCriticConfig, ActorCriticLearner]):
    """What IAC and MAAC share; they differ in which critic reads which text."""

    config_class: type[ActorCriticConfig] = ActorCriticConfig
    centralized = False
    """True: one critic for the team over the joint transcript (MAAC)."""
    fixed_fields = (
        *RoundTrainer.fixed_fields,
        *("critic_devices", "value_head_hidden_dim", "critic_type", "reference_kl_enabled"),
    )

    def __init__(
        self,
        agent_model: Any = None,
        *,
        args: ActorCriticConfig | None = None,
        critic_model: Any = None,
        critics: Sequence[Any] | None = None,
        metrics_callback: Callable[[list[RolloutSample]], Mapping[str, float]] | None = None,
        **team: Unpack[TeamKeywords],
    ) -> None:
        args = self._checked_args(args, metrics_callback)
        check_team_keywords(team, type(self).__name__)
        env = team.get("env")
        spec = team.get("task") if env is None else env.spec
        if spec is not None:  # the task owns its turns
            check_chain_turns(spec.num_turns, args.num_generations)
        size = team_size(
            args, team.get("num_agents"), team.get("agents"), team.get("formatters"), spec
        )
        count = check_critic_args(self, args, critic_model, critics, size)
        super().__init__(
            args=args,
            agent_model=agent_model,
            extra_config={"critic_models": critic_names(critic_model, critics, count)},
            **team,
        )
        self._critic_names: list[str] = self.logger.config["critic_models"]
        self.metrics_callback = metrics_callback
        # Copied before any value head is attached to an actor: the reference is the policy only.
        references = self._reference_copies()
        critics, encoders = self._build_critics(
            critic_model, critics, team.get("tokenizer"), team.get("model_config")
        )
        if args.disable_dropout:
            for critic in critics:
                disable_dropout(critic)
        self.learner = ActorCriticLearner(
            self.agents,
            critics,
            encoders,
            args,
            centralized=self.centralized,
            reference_models=references,
            num_turns=self.num_turns,
        )

    @classmethod
    def _checked_args(
        cls, args: ActorCriticConfig | None, metrics_callback: Any
    ) -> ActorCriticConfig:
        args = cls.config_class() if args is None else args
        if not isinstance(args, cls.config_class):
            raise TypeError(
                f"args must be a {cls.config_class.__name__}, got {type(args).__name__}."
            )
        if metrics_callback is not None and not callable(metrics_callback):
            raise TypeError(
                f"metrics_callback must be callable(rollouts) -> dict[str, float], "
                f"got {metrics_callback!r}."
            )
        return args

    def _reference_copies(self) -> list[Any] | None:
        if not self.args.reference_kl_enabled:
            return None
        devices = resolve_devices(self.args.reference_devices, self.num_agents, "reference_devices")
        return reference_policies(self.agents, devices)

    @property
    def critics(self) -> list[ValueModel]:
        return self.learner.critics

    @property
    def critic_encoders(self) -> list[LLMAgent]:
        """Tokenizer (and chat template) of each critic."""
        return self.learner.critic_encoders

    @property
    def critic_optimizers(self) -> list[torch.optim.Optimizer]:
        return self.learner.critic_optimizers

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
            devices = [self.agents[0 if self.centralized else c].device for c in range(count)]
        return devices

    def _identity(self) -> dict[str, Any]:
        return {
            **super()._identity(),
            "num_generations": self.args.num_generations,
            "critic_models": self._critic_names,
        }

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
            samples = [s for agent in self.learner.rollouts(tree, normalize=False) for s in agent]
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
    def _items_per_round(self) -> int:
        return self.args.rollout_buffer_size

    # -- one round (runs/round_trainer.py) ----------------------------------------------------
    def _group_size(self) -> int:
        return self.args.num_generations

    def _after_update(
        self, tree: RolloutTree, batch: Any, metrics: dict[str, float]
    ) -> dict[str, float]:
        if self.metrics_callback is None:
            return {}
        extra = self._run_callback([s for agent in batch.samples for s in agent])
        clash = sorted(set(extra) & set(metrics))
        if clash:
            raise ValueError(
                f"metrics_callback returned {clash}, which the trainer logs itself; rename "
                "those keys."
            )
        # At rollout collection, not held back (or averaged) by the logging_steps gap.
        parallel = self.parallel
        extra = aggregate_metrics(parallel, extra, {})
        self.logger.log_now(extra, self.env_step + int(parallel.sum(tree.env_steps)))
        return {}

    # -- saving -------------------------------------------------------------------------------
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
