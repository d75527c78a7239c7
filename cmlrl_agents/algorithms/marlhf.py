"""``MARLHFTrainer``: preference pairs → a Bradley-Terry reward model → RL on the learned reward.

Phases of ``train()``:

1. **pairs** from the initial policy (or a ``pairs_file``), labelled by the task reward, a
   ``preference_func`` or a comparator (:mod:`cmlrl_agents.algorithms.preference_trainer`), written
   to ``<run_dir>/preference/pairs-000.jsonl``;
2. **reward model**: :meth:`PreferenceRewardModel.fit` on a seeded split, its held-out pair
   accuracy logged as ``reward_model/eval_accuracy``; saved to ``<run_dir>/reward_model/``,
   then frozen;
3. **RL**: the ``rl_algorithm`` trainer (``trainer.rl_trainer``: MAGRPO family, IAC or MAAC,
   sharing this trainer's agents) trains on the learned reward with ``rl_args``, logging and
   checkpointing into ``<run_dir>/rl/``. Its evaluations, and :meth:`MARLHFTrainer.evaluate`,
   always score with the task reward when one is given.

``train(resume_from_checkpoint=...)`` resumes phase by phase: saved pairs and a saved reward
model are read back, and the RL phase resumes from its checkpoints (``rl_args.save_steps``).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from transformers import set_seed

from cmlrl_agents.algorithms.actor_critic import IACTrainer, MAACTrainer
from cmlrl_agents.algorithms.actor_critic_config import IACConfig, MAACConfig
from cmlrl_agents.algorithms.magrpo import (
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MAReMaxTrainer,
    MARLOOTrainer,
)
from cmlrl_agents.algorithms.magrpo_config import (
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)
from cmlrl_agents.algorithms.preference_config import MARLHFConfig
from cmlrl_agents.algorithms.preference_trainer import (
    PreferenceTrainer,
    check_sources,
    no_task_reward,
)
from cmlrl_agents.algorithms.reward_model import PreferenceRewardModel, split_pairs
from cmlrl_agents.runs.checkpoint import atomic_dir, latest_checkpoint
from cmlrl_agents.runs.trainer import TeamTrainer
from cmlrl_agents.runs.trainer_runs import resume_target, train_kwargs_error
from cmlrl_env import CoMLRLEnv, TaskSpec

__all__ = ["MARLHFTrainer", "RL_TRAINERS"]


RL_TRAINERS: dict[str, tuple[type[TeamTrainer], type]] = {
    "magrpo": (MAGRPOTrainer, MAGRPOConfig),
    "mareinforce": (MAREINFORCETrainer, MAREINFORCEConfig),
    "maremax": (MAReMaxTrainer, MAReMaxConfig),
    "marloo": (MARLOOTrainer, MARLOOConfig),
    "iac": (IACTrainer, IACConfig),
    "maac": (MAACTrainer, MAACConfig),
}
"""The RL phase's trainer and config class by ``rl_algorithm``."""


def _rl_args(args: MARLHFConfig, run_dir: Path) -> Any:
    trainer_class, config_class = RL_TRAINERS[args.rl_algorithm]
    rl = config_class() if args.rl_args is None else copy.deepcopy(args.rl_args)
    if type(rl) is not config_class:
        raise TypeError(
            f"rl_algorithm={args.rl_algorithm!r} needs rl_args to be a {config_class.__name__}, "
            f"got {type(rl).__name__}; set rl_algorithm to match, or pass "
            f"{config_class.__name__}(...)."
        )
    if rl.output_dir is None:
        rl.output_dir = str(run_dir / "rl")
    if rl.seed is None:
        rl.seed = args.seed
    return rl


class MARLHFTrainer(PreferenceTrainer):
    """Reward model from preferences, then RL on it (SPEC §4–§5); see the module docstring.

    ``reward_model``: a :class:`PreferenceRewardModel`, or a hub id / folder loaded as one on
    ``args.reward_model_device``; None loads ``agent_model`` (a str) with a new score head.
    ``critic_model`` / ``critics`` / ``metrics_callback`` go to an IAC or MAAC RL phase.
    """

    algorithm = "marlhf"

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
        wandb_config: Mapping[str, Any] | None = None,
        args: MARLHFConfig | None = None,
        *,
        reward_model: PreferenceRewardModel | str | None = None,
        preference_func: Callable[..., Any] | None = None,
        comparator: Callable[..., Any] | None = None,
        pairs_file: str | Path | None = None,
        **rl_kwargs: Any,
    ) -> None:
        args = MARLHFConfig() if args is None else args
        if not isinstance(args, MARLHFConfig):
            raise TypeError(f"args must be a MARLHFConfig, got {type(args).__name__}.")
        check_sources(reward_func, preference_func, comparator, pairs_file, eval_dataset)
        if train_dataset is None:
            raise ValueError("MARLHFTrainer needs train_dataset: its RL phase trains on it.")
        super().__init__(
            args=args,
            agent_model=agent_model,
            agents=agents,
            num_agents=num_agents,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=no_task_reward if reward_func is None else reward_func,
            reward_processor=reward_processor,
            formatters=formatters,
            wandb_config=wandb_config,
        )
        self.setup_preferences(
            has_task_reward=reward_func is not None,
            preference_func=preference_func,
            comparator=comparator,
            pairs_file=pairs_file,
        )
        self.reward_model = self._reward_model(reward_model, agent_model)
        self.rl_trainer = self._rl_trainer(
            train_dataset, eval_dataset, formatters, reward_func, reward_processor, rl_kwargs
        )

    def _reward_model(self, given: Any, agent_model: Any) -> PreferenceRewardModel:
        if isinstance(given, PreferenceRewardModel):
            return given
        source = given if given is not None else agent_model
        if not isinstance(source, (str, Path)):
            raise ValueError(
                "no reward model: pass reward_model=PreferenceRewardModel(...) or a hub id / "
                "folder (or agent_model as a str, whose backbone gets a new score head)."
            )
        return PreferenceRewardModel.from_pretrained(
            source, device=self.args.reward_model_device, max_length=self.args.reward_max_length
        )

    def _rl_trainer(
        self, train: Any, evaluation: Any, formatters: Any, reward: Any, processor: Any, kw: Any
    ) -> TeamTrainer:
        args = self.args
        rl_args = _rl_args(args, self.run_dir)
        trainer_class = RL_TRAINERS[args.rl_algorithm][0]
        trainer = trainer_class(
            agents=self.agents,
            num_agents=self.num_agents,
            train_dataset=train,
            eval_dataset=evaluation,
            reward_func=self.reward_model,
            formatters=formatters,
            args=rl_args,
            **kw,
        )
        if reward is not None and evaluation is not None:
            # The RL trainer learns on the reward model; its evaluation scores with the task
            # reward, early termination off as every trainer's evaluation env.
            spec = TaskSpec(
                evaluation,
                formatters,
                reward,
                reward_processor=processor,
                num_agents=self.num_agents,
                num_turns=rl_args.num_turns,
            )
            trainer.eval_env = CoMLRLEnv.from_spec(spec)
        return trainer

    # -- the phases -------------------------------------------------------------------------------
    @property
    def reward_model_dir(self) -> Path:
        return self.run_dir / "reward_model"

    def train(
        self, resume_from_checkpoint: str | Path | bool | None = None, **unsupported: Any
    ) -> dict[str, float]:
        """Pairs, reward model, RL (each phase read back when resuming); returns the RL phase's
        last training metrics."""
        if unsupported:
            raise train_kwargs_error(unsupported)
        resume = resume_target(resume_from_checkpoint)
        if self.args.seed is not None:
            set_seed(self.args.seed)
        self.logger.write_config()
        done = resume is not None and self.pairs_path(0).is_file()
        pairs = self.saved_pairs(0) if done else self.round_pairs(0)
        if resume is not None and (self.reward_model_dir / "metrics.json").is_file():
            self._load_reward_model()
        else:
            self.fit_reward_model(pairs)
        self.reward_model.freeze()
        rl = self.rl_trainer
        rl_resume = resume
        if resume == "latest" and latest_checkpoint(rl.checkpoint_root) is None:
            rl_resume = None  # stopped before the RL phase saved anything: it starts fresh
        if rl_resume is None:
            rl.env_step = self.env_step  # one env_step axis across the phases
        last = rl.train(resume_from_checkpoint=rl_resume)
        self.env_step = rl.env_step
        if self.args.eval_interval:
            self.evaluate()
        self.logger.flush()
        return last

    def fit_reward_model(self, pairs: list[Any]) -> dict[str, float]:
        """Phase 2: Bradley-Terry on a seeded split; logs and saves the model and metrics."""
        args = self.args
        train, held = split_pairs(pairs, args.reward_eval_fraction, args.seed)
        metrics = self.reward_model.fit(
            train,
            held,
            learning_rate=args.reward_learning_rate,
            epochs=args.reward_num_train_epochs,
            batch_size=args.reward_batch_size,
            max_grad_norm=args.max_grad_norm,
            seed=args.seed,
        )
        self.logger.log_now(metrics, self.env_step)
        with atomic_dir(self.reward_model_dir) as tmp:
            torch.save(self.reward_model.model.state_dict(), tmp / "model.pt")
            (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        self.reward_metrics = metrics
        return metrics

    def _load_reward_model(self) -> None:
        state = torch.load(
            self.reward_model_dir / "model.pt", map_location=self.reward_model.device
        )
        self.reward_model.model.load_state_dict(state)
        self.reward_metrics = json.loads((self.reward_model_dir / "metrics.json").read_text())

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """The RL phase's evaluation with the task reward (``{}`` without eval_dataset); logged
        in ``<run_dir>/rl`` and returned."""
        n = self.rl_trainer.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        return self.rl_trainer.evaluate_items(n)

    def save_model(self, output_dir: str | Path) -> None:
        """The agents (``agent_i``) as every trainer saves them, and ``reward_model/``."""
        super().save_model(output_dir)
        self.reward_model.model.save_pretrained(Path(output_dir) / "reward_model")
        self.reward_model.tokenizer.save_pretrained(Path(output_dir) / "reward_model")

    def save_checkpoint(self) -> Path:
        """A checkpoint of the RL phase (the pairs and the reward model are saved as they are
        made)."""
        return self.rl_trainer.save_checkpoint()

    def close(self) -> None:
        self.rl_trainer.close()
        super().close()
