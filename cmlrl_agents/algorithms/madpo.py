"""``MADPOTrainer``: multi-agent DPO, offline (one round) or iterative (``num_iterations``).

Each round: (1) pairs from the current policy (or, in round 0, a ``pairs_file``), see
:mod:`cmlrl_agents.algorithms.preference_trainer`; (2) ``num_train_epochs`` shuffled passes of DPO
steps (``pair_batch_size`` pairs each, :class:`~cmlrl_agents.algorithms.preference_dpo.DPOLearner`)
over them and the last ``replay_iterations`` rounds' pairs. The reference is the initial policy,
frozen: a copy of each agent's weights, or with ``peft_config=LoraConfig(...)`` (one LoRA
adapter per agent over one base held once) the base with its adapters disabled.

Schedule: with ``eval_interval > 0`` an evaluation (task reward) runs before every
``eval_interval``-th round's pair building, round 0 included, and after the last round.
Checkpoints (``save_steps > 0``): at the end of a DPO epoch once ``save_steps`` more pairs were
trained, and at the end; a resumed round reads its pairs back from the run folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Unpack

import torch

from cmlrl_agents.algorithms.preference_config import MADPOConfig
from cmlrl_agents.algorithms.preference_dpo import DPOLearner, PairEpoch, PreparedPairs
from cmlrl_agents.algorithms.preference_trainer import PreferenceTrainer, preference_team
from cmlrl_agents.policies.reference import Reference
from cmlrl_agents.policies.sampling import row_key
from cmlrl_agents.runs.logging import ProgressBar
from cmlrl_agents.runs.trainer_base import PAIR_KEYS
from cmlrl_agents.runs.trainer_keywords import TeamKeywords

__all__ = ["MADPOTrainer"]


class MADPOTrainer(PreferenceTrainer[MADPOConfig, DPOLearner]):
    """Multi-agent DPO with a frozen reference (SPEC §5's preference-based trainers).

    The task as for MAGRPO (``train_dataset``, ``formatters``, ``reward_func``, or ``env=``);
    pairs labelled by the task reward unless ``preference_func`` or ``comparator`` is given;
    ``pairs_file`` (JSON lines) gives round 0's pairs, e.g. human labels. The team as for every
    trainer (``agent_model=`` or ``agents=``, ``peft_config=`` for adapter agents).
    """

    algorithm = "madpo"

    def __init__(
        self,
        agent_model: Any = None,
        args: MADPOConfig | None = None,
        *,
        preference_func: Callable[..., Any] | None = None,
        comparator: Callable[..., Any] | None = None,
        pairs_file: str | Path | None = None,
        **team: Unpack[TeamKeywords],
    ) -> None:
        args = MADPOConfig() if args is None else args
        if not isinstance(args, MADPOConfig):
            raise TypeError(f"args must be a MADPOConfig, got {type(args).__name__}.")
        checked, has_task_reward = preference_team(
            team,
            "MADPOTrainer",
            preference_func=preference_func,
            comparator=comparator,
            pairs_file=pairs_file,
            num_iterations=args.num_iterations,
        )
        super().__init__(args=args, agent_model=agent_model, **checked)
        self.setup_preferences(
            has_task_reward=has_task_reward,
            preference_func=preference_func,
            comparator=comparator,
            pairs_file=pairs_file,
        )
        self.learner = DPOLearner(self.agents, args)

    @property
    def reference_models(self) -> list[Reference]:
        """The frozen reference policy: per agent a copy of its initial weights, or for an
        adapter agent its base with adapters disabled (one object per shared base)."""
        return self.learner.reference_models

    # -- the loop: rounds of pairs and DPO epochs (TeamTrainer.train's frame) ---------------------
    def _check_trainable(self) -> None:
        if self.env is None and self.pairs_file is None:
            raise ValueError(
                "MADPOTrainer was built without train_dataset or pairs_file, so train() has no "
                "pairs to learn from; pass train_dataset=... (with a pair source) or pairs_file=."
            )

    def _progress(self) -> tuple[int | None, int]:
        return self.args.num_iterations, self.epoch

    def _train_loop(self, progress: ProgressBar) -> dict[str, float]:
        """``num_iterations`` rounds of pairs and DPO epochs, then an evaluation; the last
        epoch's metrics."""
        args = self.args
        last: dict[str, float] = {}
        while self.epoch < args.num_iterations:
            if self.epoch_position < args.num_train_epochs:
                last = self._train_iteration(self.epoch) or last
            self.epoch += 1
            self.epoch_position = 0
            progress.update(1, postfix={k: last[k] for k in ("loss",) if k in last})
        if args.eval_interval:
            self.evaluate_during_training()
        return last

    def _train_iteration(self, k: int) -> dict[str, float]:
        if self.epoch_position == 0:
            if self.eval_due(k):
                self.evaluate_during_training()
            pairs = self.round_pairs(k)
        else:  # resumed inside the round: its pairs as built then
            pairs = self.saved_pairs(k)
        replay = self.replay_pairs(k)
        data = self.learner.prepare(pairs + replay)
        last: dict[str, float] = {}
        while self.epoch_position < self.args.num_train_epochs:
            last = self.dpo_epoch(data)
            last.update(
                {
                    "preference/iteration": float(k),
                    "preference/train_pairs": float(len(data.pairs)),
                    "preference/replay_pairs": float(len(replay)),
                }
            )
            self.epoch_position += 1
            self.items_seen += len(data.pairs)
            self.logger.log_now(last, self.env_step)
            self._maybe_checkpoint(len(data.pairs))
        self.generation_backend.sync(self.agents)  # the next round's pairs and evaluations
        return last

    def dpo_epoch(self, data: PreparedPairs) -> dict[str, float]:
        """One shuffled pass of DPO steps over ``data`` (the learner's ``update``); the steps'
        mean metrics. The order is drawn from the run's seed, the round and the epoch (the same
        on every rank of a launch, and unchanged by evaluation or resuming)."""
        order_key = row_key(self.sample_seed, PAIR_KEYS, self.epoch, self.epoch_position)
        generator = torch.Generator().manual_seed(order_key)
        order = torch.randperm(len(data.pairs), generator=generator).tolist()
        return self.learner.update(PairEpoch(data, order))
