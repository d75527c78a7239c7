"""What every trainer shares: the team, the env, the training loop, evaluation, logging, saving.

A concrete trainer supplies two verbs, ``_train_batch(items) -> (metrics, env_steps)`` and its
optimizer/model state for checkpoints; everything else (the schedule counted in task items, the
evaluation of SPEC §5, the metric names of SPEC §7, checkpoints) lives here once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from datasets import Dataset, IterableDataset

from cmlrl_agents.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from cmlrl_agents.config import SharedConfig
from cmlrl_agents.logging import MetricsLogger, ProgressBar
from cmlrl_agents.plotting import plot_metrics
from cmlrl_agents.policy import LLMAgent, SamplingConfig
from cmlrl_agents.rollout import RolloutTree, collect_tree
from cmlrl_agents.team import build_agents, resolve_num_agents
from cmlrl_env import CoMLRLEnv
from cmlrl_env.core import Task
from cmlrl_env.dataset import stream_pass

__all__ = ["TeamTrainer", "turn_metrics"]

Item = tuple[Mapping[str, Any], int | None]


def turn_metrics(
    tree: RolloutTree, returns: list[torch.Tensor], prefix: str = ""
) -> dict[str, float]:
    """``turn_k/reward_mean`` and ``turn_k/expected_return`` over every joint action of turn k."""
    metrics = {}
    for level, ret in zip(tree.levels, returns, strict=True):
        metrics[f"{prefix}turn_{level.turn}/reward_mean"] = float(level.rewards.mean())
        metrics[f"{prefix}turn_{level.turn}/expected_return"] = float(ret.mean())
    return metrics


class TeamTrainer:
    """Base of every trainer: see the module docstring."""

    algorithm = "base"

    def __init__(
        self,
        *,
        args: SharedConfig,
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
        env: CoMLRLEnv | None = None,
        wandb_config: Mapping[str, Any] | None = None,
    ) -> None:
        self.args = args
        n = resolve_num_agents(
            num_agents=num_agents,
            **{"args.num_agents": args.num_agents},
            agents=None if agents is None else len(agents),
            formatters=len(formatters) if isinstance(formatters, (list, tuple)) else None,
            env=None if env is None else env.task.num_agents,
        )
        self.num_agents = n
        if env is not None:
            given = (train_dataset, formatters, reward_func, reward_processor, external_transition)
            self._check_env(env, *given)
        else:
            env = self._build_env(
                train_dataset, formatters, reward_func, reward_processor, external_transition, n
            )
        self.env = env
        self.task: Task = env.task
        self.agents: list[LLMAgent] = build_agents(
            agent_model=agent_model,
            agents=agents,
            tokenizer=tokenizer,
            num_agents=n,
            model_config=model_config,
        )
        self.eval_dataset = eval_dataset
        self.env_step = 0
        self.items_seen = 0
        self.epoch = 0
        self.epoch_position = 0
        self.run_dir = Path(
            args.output_dir or f"runs/{self.algorithm}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
        self.logger = MetricsLogger(
            self.run_dir,
            logging_steps=args.logging_steps,
            wandb_config=None if wandb_config is None else dict(wandb_config),
            run_config={"algorithm": self.algorithm, "num_agents": n, **args.to_dict()},
            verbose=args.verbose,
        )

    # -- construction helpers ---------------------------------------------------------------
    def _build_env(
        self,
        dataset: Any,
        formatters: Any,
        reward_func: Any,
        processor: Any,
        transition: Any,
        num_agents: int,
    ) -> CoMLRLEnv:
        if dataset is None:
            raise ValueError("train_dataset is required (or pass env=CoMLRLEnv(...)).")
        if reward_func is None:
            raise ValueError("reward_func is required (or pass env=CoMLRLEnv(...)).")
        return CoMLRLEnv(
            dataset,
            formatters,
            reward_func,
            num_agents=num_agents,
            num_turns=self.args.num_turns,
            external_transition=transition,
            reward_processor=processor,
            early_termination_threshold=self.args.early_termination_threshold,
        )

    def _check_env(self, env: CoMLRLEnv, *given: Any) -> None:
        if any(g is not None for g in given):
            raise ValueError(
                "env= already holds the dataset, formatters, reward_func, "
                "reward_processor and external_transition; pass them to CoMLRLEnv, "
                "not to the trainer as well."
            )
        if env.source.item_order != "dataset":
            raise ValueError(
                f"env has item_order={env.source.item_order!r}, but trainers read the task items "
                "in dataset order (SPEC §2); build the env with item_order='dataset' and "
                "shuffle the dataset itself (train_dataset.shuffle(seed=42)) for another order."
            )
        task = env.task
        for name in ("num_turns", "early_termination_threshold"):
            if getattr(task, name) != getattr(self.args, name):
                raise ValueError(
                    f"env has {name}={getattr(task, name)!r} but args.{name}="
                    f"{getattr(self.args, name)!r}; make them equal."
                )

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

    # -- the loop -----------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | Path | None = None) -> dict[str, float]:
        """Train for ``args.num_train_epochs`` passes over the training items."""
        if self.args.seed is not None:
            _seed_everything(self.args.seed)
        if resume_from_checkpoint is not None:
            self.load_checkpoint(resume_from_checkpoint)
        progress = ProgressBar(
            self._total_items(), verbose=self.logger.verbose, desc=self.algorithm
        )
        progress.update(self.items_seen)
        last: dict[str, float] = {}
        while self.epoch < self.args.num_train_epochs:
            for start, items in self._batches(self.epoch_position):
                if self._eval_due(start):
                    self.evaluate_items(self.args.eval_num_samples)
                last, steps = self._train_batch(items)
                self.env_step += steps
                self.items_seen += len(items)
                self.epoch_position += len(items)
                self.logger.log_train(last, self.env_step)
                progress.update(len(items), postfix=_reward_postfix(last))
                self._maybe_checkpoint(len(items))
            self.epoch += 1
            self.epoch_position = 0
        progress.close()
        self.logger.flush()
        if self.args.save_steps:
            self.save_checkpoint()
        if self.logger.history:
            plot_metrics(self.run_dir)
        return last

    def close(self) -> None:
        """Flush the metric files and finish the W&B run (nothing else ends it)."""
        self.logger.close()

    def _train_batch(self, items: list[Item]) -> tuple[dict[str, float], int]:
        raise NotImplementedError

    def _items_per_batch(self) -> int:
        return 1

    def _dataset(self) -> Dataset | IterableDataset:
        return self.env.source.dataset

    def _total_items(self) -> int | None:
        data = self._dataset()
        return len(data) * self.args.num_train_epochs if isinstance(data, Dataset) else None

    def _batches(self, skip: int) -> Iterator[tuple[int, list[Item]]]:
        """Batches of the epoch's items in dataset order; a batch never spans an eval point."""
        size, interval = self._items_per_batch(), self.args.eval_interval
        batch: list[Item] = []
        start = skip
        items = _enumerate_items(
            self._dataset(), skip, name="train_dataset", pass_number=self.epoch + 1
        )
        for index, item in items:
            batch.append((item, index))
            next_index = index + 1
            if len(batch) == size or (interval and next_index % interval == 0):
                yield start, batch
                start, batch = next_index, []
        if batch:
            yield start, batch

    def _eval_due(self, position: int) -> bool:
        interval = self.args.eval_interval
        return bool(interval) and position % interval == 0

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate_items(self, num_eval_samples: int) -> dict[str, float]:
        """One response per agent per turn on the first ``num_eval_samples`` eval items."""
        if self.eval_dataset is None:
            return {}
        if (
            isinstance(num_eval_samples, bool)
            or not isinstance(num_eval_samples, int)
            or num_eval_samples < 1
        ):
            raise ValueError(f"num_eval_samples must be a positive int, got {num_eval_samples!r}.")
        items = list(
            _enumerate_items(
                self.eval_dataset, 0, limit=num_eval_samples, name="eval_dataset", pass_number=None
            )
        )
        trees = []
        for i in range(0, len(items), self.args.eval_batch_size):
            chunk = [(item, index) for index, item in items[i : i + self.args.eval_batch_size]]
            trees.append(
                collect_tree(
                    self.task, self.agents, chunk, num_generations=1, sampling=self.sampling
                )
            )
        metrics = self._eval_metrics(trees)
        metrics.update({f"eval/{k}": v for k, v in self._custom_eval_metrics(trees).items()})
        self.logger.log_eval(metrics, self.env_step)
        return metrics

    def _eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        sums: dict[str, list[float]] = {}
        for tree in trees:
            for key, value in self._tree_eval_values(tree).items():
                sums.setdefault(key, []).extend(value)
        return {f"eval/{k}": float(np.mean(v)) for k, v in sums.items()}

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        """Trainer-specific evaluation metrics (without the ``eval/`` prefix)."""
        return {}

    def _tree_eval_values(self, tree: RolloutTree) -> dict[str, list[float]]:
        values: dict[str, list[float]] = {}
        for level, ret in zip(tree.levels, tree.returns(self.args.discount), strict=True):
            values[f"turn_{level.turn}/reward_mean"] = level.rewards.reshape(-1).tolist()
            values[f"turn_{level.turn}/expected_return"] = ret.reshape(-1).tolist()
        return values

    # -- saving -------------------------------------------------------------------------------
    def save_model(self, output_dir: str | Path) -> None:
        """One ``from_pretrained``-loadable folder per agent: ``output_dir/agent_i``."""
        for i, agent in enumerate(self.agents):
            folder = Path(output_dir) / f"agent_{i}"
            agent.model.save_pretrained(folder)
            agent.tokenizer.save_pretrained(folder)

    def _maybe_checkpoint(self, added: int) -> None:
        every = self.args.save_steps
        if every and self.items_seen // every != (self.items_seen - added) // every:
            self.save_checkpoint()

    def _checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, Any]]:
        """The trainable models and their optimizers, by name (a trainer may add critics)."""
        models = {f"agent_{i}": agent.model for i, agent in enumerate(self.agents)}
        optimizers = {f"agent_{i}": opt for i, opt in enumerate(self.optimizers)}
        return models, optimizers

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def save_checkpoint(self) -> Path:
        """``run_dir/checkpoints/checkpoint-<items seen>``: weights, optimizers, RNG, position and
        metric history, written atomically; the newest ``save_total_limit`` are kept.

        Frozen reference models are not saved: they are the initial weights, which the trainer
        that resumes is built from again.
        """
        models, optimizers = self._checkpoint_parts()
        state = {
            "algorithm": self.algorithm,
            "epoch": self.epoch,
            "epoch_position": self.epoch_position,
            "items_seen": self.items_seen,
            "env_step": self.env_step,
            "logger": self.logger.state_dict(),
            "config": self.args.to_dict(),
        }
        return save_checkpoint(
            self.checkpoint_root,
            self.items_seen,
            models=models,
            optimizers=optimizers,
            trainer_state=state,
            keep_last=self.args.save_total_limit,
        )

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint folder, or ``"latest"`` under this run's ``checkpoints/``."""
        if str(path) == "latest":
            found = latest_checkpoint(self.checkpoint_root)
            if found is None:
                raise FileNotFoundError(
                    f"resume_from_checkpoint='latest' but {self.checkpoint_root} holds no "
                    "complete checkpoint; set args.output_dir to the run to resume, or pass a "
                    "checkpoint folder."
                )
            path = found
        models, optimizers = self._checkpoint_parts()
        state = load_checkpoint(path, models=models, optimizers=optimizers)
        if state["algorithm"] != self.algorithm:
            raise ValueError(
                f"{path} was written by the {state['algorithm']} trainer, not {self.algorithm}."
            )
        self.epoch, self.epoch_position = state["epoch"], state["epoch_position"]
        self.items_seen, self.env_step = state["items_seen"], state["env_step"]
        self.logger.load_state_dict(state["logger"])


def _enumerate_items(
    data: Dataset | IterableDataset,
    skip: int,
    limit: int | None = None,
    *,
    name: str,
    pass_number: int | None,
) -> Iterator[tuple[int, dict[str, Any]]]:
    if isinstance(data, Dataset):
        stop = len(data) if limit is None else min(limit, len(data))
        for index in range(skip, stop):
            yield index, dict(data[index])
        return
    # A stream that yields nothing is refused as the env refuses it (empty, or one-shot on a
    # later pass), instead of silently training on no items.
    for index, item in enumerate(stream_pass(data, name=name, pass_number=pass_number)):
        if limit is not None and index >= limit:
            return
        if index >= skip:
            yield index, dict(item)


def _reward_postfix(metrics: Mapping[str, float]) -> dict[str, float]:
    return {
        k.split("/")[0]: v
        for k, v in metrics.items()
        if k.startswith("turn_") and k.endswith("/reward_mean")
    }


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
