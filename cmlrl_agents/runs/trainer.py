"""What every trainer shares: the team, the env, the training loop, evaluation, logging, saving.

The trainer is the loop: collect a round's rollouts (``_train_round``), hand them to its
``learner`` (an object with a public ``update(batch) -> metrics`` that holds the optimizers and
reference models, see :mod:`cmlrl_agents.algorithms.policy_gradient` and
:mod:`cmlrl_agents.algorithms.actor_critic_learner`), log, evaluate and checkpoint. The schedule
counted in task items, the evaluation of SPEC §5 and checkpoints live here once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Unpack

import torch
from datasets import Dataset, IterableDataset
from transformers import set_seed

from cmlrl_agents._checks import check_eval_dataset
from cmlrl_agents.algorithms.schedules import round_sizes
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.build import build_agents, resolve_num_agents
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.generation import GenerationBackend, make_backend
from cmlrl_agents.runs.config import SharedConfig
from cmlrl_agents.runs.distributed import data_parallel, refuse_data_parallel
from cmlrl_agents.runs.evaluation import collect_eval_trees, mean_eval_metrics
from cmlrl_agents.runs.logging import MetricsLogger, ProgressBar
from cmlrl_agents.runs.metrics import reward_postfix
from cmlrl_agents.runs.plotting import plot_metrics
from cmlrl_agents.runs.rollout import RolloutTree
from cmlrl_agents.runs.run_dirs import default_run_dir, foreign_checkpoints, model_name, new_run_id
from cmlrl_agents.runs.threads import apply_num_threads
from cmlrl_agents.runs.trainer_checks import (
    check_agent_sampling,
    check_given_task,
    check_reference_devices,
)
from cmlrl_agents.runs.trainer_keywords import TASK_PIECES, TeamKeywords, check_team_keywords
from cmlrl_agents.runs.trainer_runs import RunMixin, resume_target, train_kwargs_error
from cmlrl_env import CoMLRLEnv, TaskSpec

__all__ = ["TeamTrainer"]

IndexedItem = tuple[Mapping[str, Any], int | None]
"""A task item and its index in the dataset (None for a given item), as ``collect_tree`` takes
it."""


class TeamTrainer(RunMixin):
    """Base of every trainer: see the module docstring."""

    algorithm = "base"
    fixed_fields: tuple[str, ...] = (
        *("num_agents", "num_turns", "early_termination_threshold", "output_dir"),
        *("agent_devices", "reference_devices", "lr_scheduler_type", "warmup_steps"),
    )
    """Config fields read once, at construction: assigning a new value raises (see
    ``ValidatedConfig.fix_fields``)."""
    supports_data_parallel = False
    """Whether the trainer shards items and sums gradients under torchrun (distributed.py);
    one that does not is refused there, rather than training each rank on its own."""

    def __init__(
        self,
        *,
        args: SharedConfig,
        agent_model: Any = None,
        extra_config: Mapping[str, Any] | None = None,
        **team: Unpack[TeamKeywords],
    ) -> None:
        check_team_keywords(team, type(self).__name__)
        env, task, eval_dataset = team.get("env"), team.get("task"), team.get("eval_dataset")
        agents, formatters = team.get("agents"), team.get("formatters")
        self.args = args
        # Under torchrun: refuse a trainer without support, join the process group and pick
        # LOCAL_RANK's GPU before any model is loaded.
        refuse_data_parallel(type(self).__name__, self.supports_data_parallel)
        spec = task if env is None else env.spec
        n = self.team_size(args, team.get("num_agents"), agents, formatters, spec)
        self.num_agents = n
        devices = resolve_devices(args.agent_devices, n, "agent_devices")
        check_reference_devices(args, n)
        check_agent_sampling(args, n)
        given = tuple(team.get(k) for k in TASK_PIECES)
        self.spec: TaskSpec | None = self._task_spec(env, task, given, eval_dataset, n)
        """The run's task (None: a trainer that only saves); ``task=`` gives it whole."""
        if env is None and self.spec is not None and self.spec.dataset is not None:
            env = CoMLRLEnv.from_spec(self.spec)
        self.env: CoMLRLEnv | None = env
        """None without ``train_dataset``: the trainer can evaluate and save, not train."""
        check_eval_dataset(eval_dataset)
        self.eval_env: CoMLRLEnv | None = self._eval_env(eval_dataset)
        """The env over ``eval_dataset`` with early termination off (see ``_eval_env``)."""
        self.agents: list[LLMAgent] = build_agents(
            agent_model=agent_model,
            agents=agents,
            tokenizer=team.get("tokenizer"),
            num_agents=n,
            model_config=team.get("model_config"),
            devices=devices,
            peft_config=team.get("peft_config"),
        )
        self.model_names = [model_name(agent_model or agent) for agent in self.agents]
        self.eval_dataset = eval_dataset
        self.generation_backend: GenerationBackend = make_backend(args.generation_backend)
        """Any ``GenerationBackend``; ``sync(agents)`` runs after every update."""
        self.env_step = 0
        self.items_seen = 0
        self.epoch = 0
        self.epoch_position = 0
        self.run_id = new_run_id()
        self.run_dir = Path(args.output_dir or default_run_dir(self.algorithm, self.run_id))
        self.logger = self._make_logger(team.get("wandb_config"), extra_config)

    def _make_logger(
        self, wandb_config: Mapping[str, Any] | None, extra_config: Mapping[str, Any] | None
    ) -> MetricsLogger:
        run_config = {
            "algorithm": self.algorithm,
            "num_agents": self.num_agents,
            "models": self.model_names,
            **dict(extra_config or {}),
            **self.args.to_dict(),
        }
        main = data_parallel().is_main  # under torchrun only rank 0 writes files, W&B, progress
        return MetricsLogger(
            self.run_dir if main else None,
            logging_steps=self.args.logging_steps,
            wandb_config=None if wandb_config is None or not main else dict(wandb_config),
            run_config=run_config,
            verbose=self.args.verbose if main else False,
            # Another run's config.json stays until train() knows: resume it, or replace it.
            write_config=not foreign_checkpoints(self.checkpoint_root, self.run_id),
        )

    @staticmethod
    def team_size(
        args: SharedConfig,
        num_agents: int | None,
        agents: Any,
        formatters: Any,
        spec: TaskSpec | None,
    ) -> int:
        """The team size every given source agrees on (a pure check, before any loading);
        ``spec`` is the ``task=`` or the ``env=``'s spec."""
        if spec is not None and not isinstance(spec, TaskSpec):
            raise TypeError(f"task must be a cmlrl_env.TaskSpec, got {type(spec).__name__}.")
        return resolve_num_agents(
            num_agents=num_agents,
            **{"args.num_agents": args.num_agents},
            agents=None if agents is None else len(agents),
            formatters=len(formatters) if isinstance(formatters, (list, tuple)) else None,
            task=None if spec is None else spec.num_agents,
        )

    @property
    def args(self) -> SharedConfig:
        """The config; the fields in ``fixed_fields`` cannot change after construction."""
        return self._args

    @args.setter
    def args(self, value: SharedConfig) -> None:
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

    # -- construction helpers ---------------------------------------------------------------
    def _task_spec(
        self,
        env: CoMLRLEnv | None,
        task: TaskSpec | None,
        given: tuple[Any, ...],
        eval_dataset: Any,
        num_agents: int,
    ) -> TaskSpec | None:
        """The one ``TaskSpec`` of the run: ``env.spec``, ``task=``, or built from the seed's
        keyword arguments; without a reward, None (saving only)."""
        if env is not None and task is not None:
            raise ValueError("pass env= or task=, not both (env.spec is the env's task).")
        if env is not None or task is not None:
            label = "env" if env is not None else "task"
            spec = env.spec if env is not None else task
            check_given_task(spec, self.args, given, label)
            return spec
        dataset, formatters, reward_func, processor, transition = given
        if reward_func is None:
            if dataset is not None or eval_dataset is not None:
                raise ValueError("reward_func is required (or pass env=CoMLRLEnv(...)).")
            return None
        # The seed's keyword arguments become the one validated TaskSpec the env takes.
        return TaskSpec(
            dataset,
            formatters,
            reward_func,
            reward_processor=processor,
            external_transition=transition,
            num_agents=num_agents,
            num_turns=self.args.num_turns,
            early_termination_threshold=self.args.early_termination_threshold,
        )

    def _eval_env(self, eval_dataset: Any) -> CoMLRLEnv | None:
        """The task over ``eval_dataset`` with early termination off: evaluation plays every
        turn, so custom eval metrics always see ``[agent][item][turn]`` for each turn; the
        standard metrics still score each item as training's early termination would
        (``evaluation.eval_values``)."""
        if eval_dataset is None or self.spec is None:
            return None
        spec = self.spec.replace(dataset=eval_dataset, early_termination_threshold=None)
        return CoMLRLEnv.from_spec(spec)

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The agents' optimizers (held by ``learner``)."""
        return self.learner.optimizers

    @property
    def reference_models(self) -> list[torch.nn.Module] | None:
        """The frozen reference copies of ``reference_kl_enabled`` (held by ``learner``)."""
        return self.learner.reference_models

    @property
    def sampling(self) -> SamplingConfig:
        a = self.args
        return SamplingConfig(
            max_new_tokens=a.max_new_tokens,
            temperature=a.temperature,
            top_p=a.top_p,
            top_k=a.top_k,
            min_new_tokens=a.min_new_tokens,
        )

    @property
    def agent_sampling(self) -> list[SamplingConfig]:
        """Each agent's sampling settings (``args.agent_sampling`` over the shared fields)."""
        return [self.args.sampling_for(i) for i in range(self.num_agents)]

    # -- the loop -----------------------------------------------------------------------------
    def train(
        self, resume_from_checkpoint: str | Path | bool | None = None, **unsupported: Any
    ) -> dict[str, float]:
        """Train for ``args.num_train_epochs`` passes over the training items.

        ``resume_from_checkpoint``: a checkpoint folder, ``"latest"`` (or ``True``) for the
        newest under ``output_dir/checkpoints``; None starts fresh, which is refused in a folder
        holding another run's checkpoints unless ``args.overwrite_output_dir``.
        """
        if unsupported:  # comlrl scripts pass checkpoint_dir=... or generate kwargs here
            raise train_kwargs_error(unsupported)
        resume = resume_target(resume_from_checkpoint)
        if self.env is None:
            raise ValueError(
                f"{type(self).__name__} was built without train_dataset, so train() has no "
                "items to train on (it can evaluate and save_model). Build it with "
                "train_dataset=... and reward_func=... to train."
            )
        self._start_run(resume)
        progress = ProgressBar(
            self._total_items(), verbose=self.logger.verbose, desc=self.algorithm
        )
        progress.update(self.items_seen)
        last: dict[str, float] = {}
        while self.epoch < self.args.num_train_epochs:
            for start, items in self._rounds(self.epoch_position):
                if self._eval_due(start):
                    self.evaluate_items(self.args.eval_num_samples)
                last, steps = self._train_round(items)
                self.env_step += steps
                self.items_seen += len(items)
                self.epoch_position += len(items)
                self.logger.logging_steps = self.args.logging_steps  # may change mid-run
                self.logger.log_train(last, self.env_step)
                progress.update(len(items), postfix=reward_postfix(last, self.args.num_turns))
                self._maybe_checkpoint(len(items))
            self.epoch += 1
            self.epoch_position = 0
        progress.close()
        self.logger.flush()
        if self.args.save_steps:
            self.save_checkpoint()
        if self.logger.history and data_parallel().is_main:
            plot_metrics(self.run_dir)
        return last

    def close(self) -> None:
        """Flush the metric files and finish the W&B run (nothing else ends it)."""
        self.logger.close()

    def _train_round(self, items: list[IndexedItem]) -> tuple[dict[str, float], int]:
        raise NotImplementedError

    def _items_per_round(self) -> int:
        return 1

    def _dataset(self) -> Dataset | IterableDataset | None:
        return None if self.env is None else self.env.spec.dataset

    def _start_run(self, resume: Path | None) -> None:
        """Seed, build the schedule, then start fresh or load ``resume``'s state; write the
        run's config and apply the learning rates (every trainer's ``train`` begins so)."""
        apply_num_threads(self.args.num_threads)
        if self.args.seed is not None:
            set_seed(self.args.seed)  # python, numpy, torch (and CUDA)
        self._prepare_schedule()
        if resume is None:
            self._start_fresh()
        else:
            self.load_checkpoint(resume)
        self.logger.write_config()
        self._apply_learning_rates()

    def _prepare_schedule(self) -> None:
        """Give the learner the run's rounds (their item counts), which its learning-rate
        schedule spans; unknown (None) for a stream or without a train_dataset."""
        data = self._dataset()
        rounds = None
        if isinstance(data, Dataset):
            size, interval = self._items_per_round(), self.args.eval_interval
            rounds = list(round_sizes(len(data), size, interval)) * self.args.num_train_epochs
        self.learner.schedule(rounds)

    def _total_items(self) -> int | None:
        data = self._dataset()
        return len(data) * self.args.num_train_epochs if isinstance(data, Dataset) else None

    def _rounds(self, skip: int) -> Iterator[tuple[int, list[IndexedItem]]]:
        """The epoch's rounds (lists of ``IndexedItem``) in dataset order from ``skip`` (the
        position a resumed run restores); a round never spans an eval point."""
        assert self.env is not None, "train() checks for a train_dataset first"
        size, interval = self._items_per_round(), self.args.eval_interval
        round_items: list[IndexedItem] = []
        start = skip
        items = self.env.epoch_items(self.epoch + 1, skip, name="train_dataset")
        for index, item in items:
            round_items.append((item, index))
            next_index = index + 1
            if len(round_items) == size or (interval and next_index % interval == 0):
                yield start, round_items
                start, round_items = next_index, []
        if round_items:
            yield start, round_items

    def _eval_due(self, position: int) -> bool:
        interval = self.args.eval_interval
        return bool(interval) and position % interval == 0

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate_items(self, num_eval_samples: int) -> dict[str, float]:
        """One response per agent per turn (every turn) on the first ``num_eval_samples`` eval
        items."""
        if self.eval_env is None:
            return {}
        if (
            isinstance(num_eval_samples, bool)
            or not isinstance(num_eval_samples, int)
            or num_eval_samples < 1
        ):
            raise ValueError(f"num_eval_samples must be a positive int, got {num_eval_samples!r}.")
        env = self.eval_env
        items = list(env.epoch_items(None, 0, num_eval_samples, name="eval_dataset"))
        # Under torchrun each rank rolls out its share of the items; all get all the trees.
        trees = collect_eval_trees(
            env, self.agents, items, self.args.eval_batch_size, self.agent_sampling,
            self.generation_backend, data_parallel(),
        )  # fmt: skip
        metrics = self._eval_metrics(trees)
        metrics.update({f"eval/{k}": v for k, v in self._custom_eval_metrics(trees).items()})
        self.logger.log_eval(metrics, self.env_step)
        return metrics

    def _eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        return mean_eval_metrics(
            trees,
            self.spec.early_termination_threshold,  # training's, not the eval env's None
            self.spec.num_turns,
            self.args.discount,
        )

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        """Trainer-specific evaluation metrics (without the ``eval/`` prefix)."""
        return {}
