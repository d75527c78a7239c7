"""The team and task of a trainer, built once: agents, task spec, envs, evaluator, run folder.

:class:`TrainerBase` holds what every trainer is made of (see :mod:`trainer` for the loop that
runs it): the config (fields read once at construction are fixed), the team of agents, the one
task spec (which alone owns the turns and the termination threshold), the training and
evaluation envs, the generation backend, the run's counters and sampling seed
(:class:`RunState`), its folder with the checkpointer, and the metrics logger.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar, Unpack

import torch
from transformers import set_seed

from cmlrl_agents._checks import check_eval_dataset
from cmlrl_agents.foundation.config import SharedConfig
from cmlrl_agents.foundation.distributed import data_parallel
from cmlrl_agents.learning.learner import Learner
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.backends import make_backend
from cmlrl_agents.policies.build import build_agents
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.generation import GenerationBackend
from cmlrl_agents.policies.model_setup import disable_dropout
from cmlrl_agents.policies.reference import Reference
from cmlrl_agents.policies.sampling import row_key
from cmlrl_agents.runs.checkpointer import Checkpointer, save_models
from cmlrl_agents.runs.evaluation import Evaluator
from cmlrl_agents.runs.logging import MetricsLogger
from cmlrl_agents.runs.run_dirs import (
    check_identity,
    dataset_fingerprint,
    default_run_dir,
    foreign_checkpoints,
    model_name,
    new_run_id,
)
from cmlrl_agents.runs.trainer_checks import check_agent_sampling, check_reference_devices
from cmlrl_agents.runs.trainer_keywords import TASK_PIECES, TeamKeywords, check_team_keywords
from cmlrl_agents.runs.trainer_setup import eval_env, task_spec, team_size
from cmlrl_agents.runs.trainer_state import RunState
from cmlrl_env import CoMLRLEnv, TaskSpec

__all__ = ["TRAIN_KEYS", "EVAL_KEYS", "PAIR_KEYS", "ConfigT", "LearnerT", "TrainerBase"]

TRAIN_KEYS, EVAL_KEYS, PAIR_KEYS = 1, 2, 3
"""The key spaces of a run's sampling keys (``row_key(seed, space, ...)``)."""


ConfigT = TypeVar("ConfigT", bound=SharedConfig)
"""A trainer's config class (``MAGRPOConfig``, ...): the type of ``trainer.args``."""
LearnerT = TypeVar("LearnerT", bound=Learner[Any])
"""A trainer's learner class: the type of ``trainer.learner``."""


class TrainerBase(RunState, Generic[ConfigT, LearnerT]):
    """What every trainer is made of: see the module docstring."""

    algorithm = "base"
    fixed_fields: tuple[str, ...] = (
        *("num_agents", "num_turns", "early_termination_threshold", "output_dir"),
        *("agent_devices", "reference_devices", "lr_scheduler_type", "warmup_steps", "bf16"),
    )
    """Config fields read once, at construction: assigning a new value raises (see
    ``ValidatedConfig.fix_fields``)."""
    learner: LearnerT
    _args: ConfigT

    @property
    def generation_backend(self) -> GenerationBackend:
        """Any ``GenerationBackend`` (``args.generation_backend``'s); ``sync(agents)`` runs
        after every update. Training and evaluation read this one object: assigning another
        (a wrapper, or the backend of a trainer this one drives) replaces it for both."""
        return self.evaluator.backend

    @generation_backend.setter
    def generation_backend(self, backend: GenerationBackend) -> None:
        self.evaluator.backend = backend

    # -- the loop -----------------------------------------------------------------------------
    def __init__(
        self,
        *,
        args: ConfigT,
        agent_model: Any = None,
        extra_config: Mapping[str, Any] | None = None,
        **team: Unpack[TeamKeywords],
    ) -> None:
        check_team_keywords(team, type(self).__name__)
        env, task, eval_dataset = team.get("env"), team.get("task"), team.get("eval_dataset")
        agents, formatters = team.get("agents"), team.get("formatters")
        self.args = args
        # Under torchrun: join the process group and pick LOCAL_RANK's GPU before any model.
        self.parallel = data_parallel()
        if args.seed is not None:
            set_seed(args.seed)  # before any model, adapter or value head draws its weights
        spec = task if env is None else env.spec
        n = team_size(args, team.get("num_agents"), agents, formatters, spec)
        self.num_agents = n
        devices = resolve_devices(args.agent_devices, n, "agent_devices")
        check_reference_devices(args, n)
        check_agent_sampling(args, n)
        given = tuple(team.get(k) for k in TASK_PIECES)
        self.spec: TaskSpec | None = task_spec(args, env, task, given, eval_dataset, n)
        """The run's task (None: a trainer that only saves); it alone owns the turns and the
        termination threshold."""
        if env is None and self.spec is not None and self.spec.dataset is not None:
            env = CoMLRLEnv.from_spec(self.spec)
        self.env: CoMLRLEnv | None = env
        """None without ``train_dataset``: the trainer can evaluate and save, not train."""
        check_eval_dataset(eval_dataset)
        self.agents: list[LLMAgent] = build_agents(
            agent_model=agent_model,
            agents=agents,
            tokenizer=team.get("tokenizer"),
            num_agents=n,
            model_config=team.get("model_config"),
            devices=devices,
            peft_config=team.get("peft_config"),
        )
        if args.disable_dropout:
            for agent in self.agents:
                disable_dropout(agent.model)
        self.model_names = [model_name(agent_model or agent) for agent in self.agents]
        self.eval_dataset = eval_dataset
        self.evaluator = Evaluator(
            eval_env(self.spec, eval_dataset),
            self.agents,
            make_backend(args.generation_backend),
            self.parallel,
            None if self.spec is None else self.spec.early_termination_threshold,
            self.num_turns,
        )
        self.start_state(self._sample_seed())
        self.run_id = new_run_id()
        self.run_dir = Path(args.output_dir or default_run_dir(self.algorithm, self.run_id))
        self.checkpointer = Checkpointer(self.run_dir, self.parallel)
        self.logger = self._make_logger(team.get("wandb_config"), extra_config)

    def _sample_seed(self) -> int:
        """The seed of the run's sampling keys: ``args.seed``, else one drawn now (the same on
        every rank; a checkpoint keeps it, so a resumed run draws on as the run would have)."""
        if self.args.seed is not None:
            return self.args.seed
        return int(self.parallel.gather(secrets.randbits(62))[0])

    def _make_logger(
        self, wandb_config: Mapping[str, Any] | None, extra_config: Mapping[str, Any] | None
    ) -> MetricsLogger:
        self.extra_config = dict(extra_config or {})
        main = self.parallel.is_main  # under torchrun only rank 0 writes files, W&B, progress
        return MetricsLogger(
            self.run_dir if main else None,
            logging_steps=self.args.logging_steps,
            wandb_config=None if wandb_config is None or not main else dict(wandb_config),
            run_config=self._run_config(),
            verbose=self.args.verbose if main else False,
            # Another run's config.json stays until train() knows: resume it, or replace it.
            write_config=not foreign_checkpoints(self.checkpointer.root, self.run_id),
        )

    def _run_config(self) -> dict[str, Any]:
        """What the run uses: its algorithm, team and the config as it is now."""
        return {
            "algorithm": self.algorithm,
            "num_agents": self.num_agents,
            "models": self.model_names,
            **self.extra_config,
            **self.args.to_dict(),
            "sample_seed": self.sample_seed,  # args.seed, or the one drawn for seed=None
        }

    @property
    def args(self) -> ConfigT:
        """The config; the fields in ``fixed_fields`` cannot change after construction."""
        return self._args

    @args.setter
    def args(self, value: ConfigT) -> None:
        if "_args" in self.__dict__:
            if type(value) is not type(self._args):
                raise TypeError(
                    f"trainer.args must stay a {type(self._args).__name__}, got "
                    f"{type(value).__name__}."
                )
            for name in self.fixed_fields:
                if getattr(value, name) != getattr(self._args, name):
                    raise AttributeError(
                        f"the new args change {name} ({getattr(self._args, name)!r} -> "
                        f"{getattr(value, name)!r}), which {type(self).__name__} reads only at "
                        "construction; build a new trainer with that config."
                    )
        value.fix_fields(self.fixed_fields, type(self).__name__)
        self._args = value
        if "learner" in self.__dict__:  # the learner reads the config at every update
            self.learner.args = value

    @property
    def eval_env(self) -> CoMLRLEnv | None:
        """The env over ``eval_dataset`` with early termination off (None without one); the
        evaluator's, which a trainer may replace (MARLHF's RL phase evaluates on its own)."""
        return self.evaluator.env

    @eval_env.setter
    def eval_env(self, env: CoMLRLEnv | None) -> None:
        self.evaluator.env = env

    @property
    def num_turns(self) -> int:
        """The task's turns (the config's when the trainer has no task)."""
        if self.spec is None:
            return int(self.args.task_settings()["num_turns"])
        return self.spec.num_turns

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The agents' optimizers (held by ``learner``)."""
        return self.learner.optimizers

    @property
    def reference_models(self) -> list[Reference] | None:
        """The frozen references of ``reference_kl_enabled`` (held by ``learner``)."""
        return self.learner.reference_models

    @property
    def sampling(self) -> SamplingConfig:
        """The shared sampling settings (``agent_sampling`` overrides them per agent)."""
        return self.args.sampling_for(0, {})

    @property
    def agent_sampling(self) -> list[SamplingConfig]:
        """Each agent's sampling settings (``args.agent_sampling`` over the shared fields)."""
        return [self.args.sampling_for(i) for i in range(self.num_agents)]

    def round_key(self) -> int:
        """The sampling key of this epoch's training rounds (rows add item, turn, sample)."""
        return row_key(self.sample_seed, TRAIN_KEYS, self.epoch)

    def close(self) -> None:
        """Flush the metric files and finish the W&B run (nothing else ends it)."""
        self.logger.close()

    def save_model(self, output_dir: str | Path) -> None:
        """One ``from_pretrained``-loadable folder per agent: ``output_dir/agent_i`` (an adapter
        agent's holds its adapter alone, for ``peft.PeftModel.from_pretrained(base, folder)``);
        written by rank 0 alone under torchrun."""
        save_models(self.agents, output_dir, self.parallel)

    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must share with this trainer to be resumed (see run_dirs.py): the
        algorithm, team, data and turns (trainers add their own)."""
        data = None if self.env is None else self.env.spec.dataset
        return {
            "algorithm": self.algorithm,
            "num_agents": self.num_agents,
            "models": self.model_names,
            "model_classes": [type(a.model).__name__ for a in self.agents],
            "model_parameters": [sum(p.numel() for p in a.model.parameters()) for a in self.agents],
            "train_dataset": dataset_fingerprint(data),
            "num_turns": self.num_turns,
        }

    def _check_state(self, state: dict[str, Any], path: Path) -> None:
        if state.get("algorithm") != self.algorithm:
            raise ValueError(
                f"{path} was written by the {state.get('algorithm')} trainer, not "
                f"{self.algorithm}; resume it with that trainer."
            )
        if not isinstance(state.get("run"), dict):
            raise ValueError(f"{path} records no run identity; it was not written by a trainer.")
        check_identity(state["run"]["identity"], self._identity(), path)
