"""``MARLHFTrainer``: preference pairs → a Bradley-Terry reward model → RL on the learned reward.

Each of ``args.num_iterations`` rounds (1: offline, today's MARLHF) runs three phases:

1. **pairs** from the current policy (round 0: the initial policy, or a ``pairs_file``),
   labelled by the task reward, a ``preference_func`` or a comparator
   (:mod:`cmlrl_agents.algorithms.preference_trainer`), written to
   ``<run_dir>/preference/pairs-<round>.jsonl``;
2. **reward model**: :meth:`PreferenceRewardModel.fit` continues from the previous round's
   weights on the round's pairs (a seeded split; the held-out part measures
   ``reward_model/eval_accuracy`` on pairs of the current policy) plus the training part of the
   last ``replay_iterations`` rounds' pairs; saved to ``<run_dir>/reward_model/``, then frozen;
3. **RL**: the ``rl_algorithm`` trainer (``trainer.rl_trainer``: MAGRPO family, IAC or MAAC,
   sharing this trainer's agents, adapters included) trains ``rl_args.num_train_epochs`` epochs
   on the learned reward, logging and checkpointing into ``<run_dir>/rl/``. Its evaluations,
   and :meth:`MARLHFTrainer.evaluate`, always score with the task reward when one is given.

``train(resume_from_checkpoint=...)`` continues from the RL phase's checkpoint
(``rl_args.save_steps > 0``): inside a round's RL phase it resumes there; at a round's end it
takes those weights to the next round, whose saved pairs and reward model are read back. The
RL phase's seed is ``seed + round``, and the reward model's fit is seeded likewise, so a
resumed run trains the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Unpack

import torch
from transformers import set_seed

from cmlrl_agents.algorithms.marlhf_rl import (
    RL_TRAINERS,
    check_rl_options,
    refuse_rl_options,
    rl_config,
)
from cmlrl_agents.algorithms.preference_config import MARLHFConfig
from cmlrl_agents.algorithms.preference_pairs import PreferencePair
from cmlrl_agents.algorithms.preference_trainer import PreferenceTrainer, preference_team
from cmlrl_agents.algorithms.reward_learner import RewardFit, RewardFitArgs, RewardModelLearner
from cmlrl_agents.algorithms.reward_model import PreferenceRewardModel, split_pairs
from cmlrl_agents.learning.learner import Learner, UpdateLearner
from cmlrl_agents.policies.generation import GenerationBackend
from cmlrl_agents.policies.reference import Reference
from cmlrl_agents.runs.checkpoint import atomic_dir, latest_checkpoint, read_checkpoint
from cmlrl_agents.runs.threads import apply_num_threads
from cmlrl_agents.runs.trainer import TeamTrainer
from cmlrl_agents.runs.trainer_checks import resume_target, train_kwargs_error
from cmlrl_agents.runs.trainer_keywords import TeamKeywords

__all__ = ["MARLHFTrainer", "RL_TRAINERS"]


def reward_fit_args(args: MARLHFConfig) -> RewardFitArgs:
    """How the config fits the reward model each round."""
    return RewardFitArgs(
        learning_rate=args.reward_learning_rate,
        epochs=args.reward_num_train_epochs,
        batch_size=args.reward_batch_size,
        max_grad_norm=args.max_grad_norm,
        weight_decay=args.weight_decay,
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=args.warmup_steps,
    )


def _round_seed(seed: int | None, round_index: int) -> int | None:
    return None if seed is None else seed + round_index


class MARLHFTrainer(PreferenceTrainer[MARLHFConfig, Learner[Any]]):
    """Reward model from preferences, then RL on it (SPEC §4–§5); see the module docstring.

    The team and task as for every trainer (``**team``: ``agent_model=`` or ``agents=``,
    ``peft_config=`` for adapter agents, ``train_dataset``, ``formatters``, ``reward_func``,
    ... or ``task=`` / ``env=``). ``reward_model``: a :class:`PreferenceRewardModel`, or a hub
    id / folder loaded as one on ``args.reward_model_device`` with ``args.forward_batch_size``
    (a given one keeps its own); None loads ``agent_model`` (a
    str) with a new score head: always a model of its own, never the agents' base.
    ``rl_options``: the RL trainer's own keyword arguments, e.g. ``{"critic_model": ...}``
    for IAC/MAAC or ``{"eval_logger": ..., "eval_aggregator": ...}`` for the MAGRPO family.
    """

    algorithm = "marlhf"

    def __init__(
        self,
        agent_model: Any = None,
        args: MARLHFConfig | None = None,
        *,
        reward_model: PreferenceRewardModel | str | Path | None = None,
        preference_func: Callable[..., Any] | None = None,
        comparator: Callable[..., Any] | None = None,
        pairs_file: str | Path | None = None,
        rl_options: Mapping[str, Any] | None = None,
        **team: Unpack[TeamKeywords],
    ) -> None:
        args = MARLHFConfig() if args is None else args
        if not isinstance(args, MARLHFConfig):
            raise TypeError(f"args must be a MARLHFConfig, got {type(args).__name__}.")
        refuse_rl_options(team)
        options = check_rl_options(rl_options, args.rl_algorithm)
        checked, has_task_reward = preference_team(
            team,
            "MARLHFTrainer",
            preference_func=preference_func,
            comparator=comparator,
            pairs_file=pairs_file,
            num_iterations=args.num_iterations,
        )
        env = team.get("env")
        spec = team.get("task") if env is None else env.spec
        if (team.get("train_dataset") if spec is None else spec.dataset) is None:
            raise ValueError(
                "MARLHFTrainer needs train_dataset (or a task/env with one): its RL phase "
                "trains on it."
            )
        super().__init__(args=args, agent_model=agent_model, **checked)
        self.setup_preferences(
            has_task_reward=has_task_reward,
            preference_func=preference_func,
            comparator=comparator,
            pairs_file=pairs_file,
        )
        self.reward_model = self._reward_model(reward_model, agent_model)
        self.reward_learner: UpdateLearner[RewardFitArgs, RewardFit] = RewardModelLearner(
            self.reward_model, reward_fit_args(args)
        )
        """The reward model's learner: one update (a Bradley-Terry fit) per round."""
        self.reward_metrics: dict[str, float] = {}
        """The last fitted round's reward-model metrics (held-out accuracy, ...)."""
        self.rl_trainer = self._rl_trainer(options)
        self.rl_epochs = self.rl_trainer.args.num_train_epochs
        """RL epochs per round (``rl_args.num_train_epochs``)."""
        self.rl_seed = self.rl_trainer.args.seed

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
            source,
            device=self.args.reward_model_device,
            max_length=self.args.reward_max_length,
            forward_batch_size=self.args.forward_batch_size,
        )

    def _rl_trainer(self, options: dict[str, Any]) -> TeamTrainer[Any, Any]:
        """The RL trainer over this trainer's agents and training task, rewarded by the reward
        model; its evaluation env is this trainer's (the task reward, early termination off)."""
        assert self.spec is not None, "__init__ checked for a train_dataset"
        rl_args = rl_config(self.args, self.run_dir)
        task = self.spec.replace(
            reward_func=self.reward_model,
            reward_processor=None,  # the processor shapes the task reward, not the learned one
        )
        trainer = RL_TRAINERS[self.args.rl_algorithm](
            agents=self.agents,
            task=task,
            eval_dataset=self.eval_dataset,
            args=rl_args,
            **options,
        )
        if self.has_task_reward and self.eval_env is not None:
            trainer.eval_env = self.eval_env
        # One backend for the pairs and the RL phase: its syncs after RL updates serve the
        # next round's pairs (a backend with weights of its own, vLLM, would serve round 0's).
        trainer.generation_backend = self.generation_backend
        return trainer

    # The agents' optimizers and references belong to the RL phase's learner. This trainer
    # holds no ``learner`` of its own: its config setter would hand MARLHF's config to a
    # learner that reads ``rl_args``.
    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The agents' optimizers (the RL phase's learner holds them)."""
        return self.rl_trainer.optimizers

    @property
    def reference_models(self) -> list[Reference] | None:
        """The RL phase's frozen references (``rl_args.reference_kl_enabled``)."""
        return self.rl_trainer.reference_models

    @property
    def generation_backend(self) -> GenerationBackend:
        """The one backend of the pairs, the RL phase and the evaluations: assigning another
        replaces it in the RL trainer too."""
        return self.evaluator.backend

    @generation_backend.setter
    def generation_backend(self, backend: GenerationBackend) -> None:
        self.evaluator.backend = backend
        if hasattr(self, "rl_trainer"):  # None yet while the base trainer is being built
            self.rl_trainer.generation_backend = backend

    # -- the rounds -------------------------------------------------------------------------------
    @property
    def reward_model_dir(self) -> Path:
        return self.run_dir / "reward_model"

    def round_record(self, round_index: int) -> Path:
        """Written once a round's pairs are saved: the ``env_step`` after building them."""
        return self.run_dir / "preference" / f"round-{round_index:03d}.json"

    def train(
        self, resume_from_checkpoint: str | Path | bool | None = None, **unsupported: Any
    ) -> dict[str, float]:
        """``num_iterations`` rounds of pairs, reward model and RL (a resumed run reads the
        finished phases back); returns the last RL phase's last training metrics."""
        if unsupported:
            raise train_kwargs_error(unsupported)
        resume = resume_target(resume_from_checkpoint)
        apply_num_threads(self.args.num_threads)
        if self.args.seed is not None:
            set_seed(self.args.seed)
        if resume is None:  # refuse another run's RL checkpoints before any pair is built
            self.rl_trainer.checkpointer.start_fresh(
                self.rl_trainer.run_id, self.rl_trainer.args.overwrite_output_dir
            )
        self.logger.record_config(self._run_config())
        start, rl_resume = (0, None) if resume is None else self._restore(resume)
        last: dict[str, float] = {}
        for k in range(start, self.args.num_iterations):
            resumed = resume is not None and k == start
            last = self._round(k, resumed=resumed, rl_resume=rl_resume if resumed else None)
        if self.args.eval_interval:
            self.evaluate()
        self.logger.flush()
        return last

    def _round(self, k: int, *, resumed: bool, rl_resume: Path | None) -> dict[str, float]:
        rl = self.rl_trainer
        if rl_resume is None:  # a round from its start, or a resume before its RL phase
            if resumed and self.round_record(k).is_file():
                pairs = self.saved_pairs(k)
                self.env_step = json.loads(self.round_record(k).read_text())["env_step"]
            else:
                pairs = self.round_pairs(k)
                record = self.round_record(k)
                if self.parallel.is_main:
                    partial = record.with_suffix(".json.tmp")  # renamed: never half written
                    own = {"env_step": self.env_step, "logger": self.logger.state_dict()}
                    partial.write_text(json.dumps(own) + "\n")
                    partial.replace(record)
                self.parallel.barrier()
            if not (resumed and self._saved_reward_round() == k):
                self.fit_reward_model(pairs, k)
            rl.env_step = self.env_step  # one env_step axis across the phases
        self.reward_model.freeze()
        rl.args.num_train_epochs = (k + 1) * self.rl_epochs  # the RL trainer counts on
        rl.args.seed = _round_seed(self.rl_seed, k)
        last = rl.train(resume_from_checkpoint=rl_resume)
        self.env_step = rl.env_step
        return last

    def fit_reward_model(
        self, pairs: list[PreferencePair], round_index: int = 0
    ) -> dict[str, float]:
        """Phase 2 of round ``round_index``: Bradley-Terry on a seeded split of ``pairs`` plus
        the training part of the replayed rounds' pairs, continuing from the current weights;
        logs and saves the model and metrics."""
        args = self.args
        # Split by the run's seed (drawn for seed=None, kept by checkpoints): the replay's
        # re-split of an earlier round must give that round's training part again.
        seed = self.sample_seed
        train, held = split_pairs(pairs, args.reward_eval_fraction, _round_seed(seed, round_index))
        replay = [
            pair
            for j in self.replay_rounds(round_index)
            for pair in split_pairs(
                self.saved_pairs(j), args.reward_eval_fraction, _round_seed(seed, j)
            )[0]
        ]
        if args.seed is not None:  # dropout draws as in an uninterrupted run
            set_seed(args.seed + round_index)
        self.reward_model.unfreeze()
        self.reward_learner.args = reward_fit_args(args)  # the config may change between rounds
        fit = RewardFit(train + replay, held, _round_seed(seed, round_index))
        metrics = self.reward_learner.update(fit)
        metrics["reward_model/replay_pairs"] = float(len(replay))
        self.logger.log_now(metrics, self.env_step)
        if self.parallel.is_main:  # every rank fitted the same model; one writes it
            with atomic_dir(self.reward_model_dir) as tmp:
                torch.save(self.reward_model.model.state_dict(), tmp / "model.pt")
                (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
                (tmp / "round.json").write_text(json.dumps({"round": round_index}) + "\n")
                (tmp / "logger.json").write_text(json.dumps(self.logger.state_dict()) + "\n")
        self.parallel.barrier()
        self.reward_metrics = metrics
        return metrics

    # -- resuming -------------------------------------------------------------------------------
    def _saved_reward_round(self) -> int | None:
        path = self.reward_model_dir / "round.json"
        return json.loads(path.read_text())["round"] if path.is_file() else None

    def _restore(self, resume: str | Path) -> tuple[int, Path | None]:
        """Where a resumed run starts: the round, and the RL checkpoint to resume inside that
        round's RL phase (None: the round starts before it, from the checkpoint's weights)."""
        rl = self.rl_trainer
        path = latest_checkpoint(rl.checkpointer.root) if str(resume) == "latest" else Path(resume)
        start, inside = 0, False
        if path is None:  # the RL phase saved nothing: round 0, from the initial weights
            if self.round_record(1).is_file():
                raise ValueError(
                    f"{self.run_dir} reached round 1 but {rl.checkpointer.root} holds no "
                    "checkpoint of the policy after round 0, so the run cannot continue; set "
                    "rl_args.save_steps > 0 (each RL phase then ends with one) and start again."
                )
        else:
            state = read_checkpoint(path)["trainer_state"]
            start, into = divmod(state["epoch"], self.rl_epochs)
            inside = into != 0 or state["epoch_position"] != 0
            if not inside:  # the policy at the end of round start - 1
                rl.load_checkpoint(path)
                self.env_step = rl.env_step
        self._load_reward_model(start, inside)
        own = self._logger_state(start)
        if own is not None:
            self.logger.load_state_dict(own)
        return start, path if inside else None

    def _logger_state(self, start: int) -> dict[str, Any] | None:
        """This trainer's own metrics (``preference/*``, ``reward_model/*``) as they stood after
        the last phase a resume at round ``start`` does not redo: the reward model's fit of
        ``start``, else its pairs, else the fit before it (``_load_reward_model`` has checked
        that the saved model is one of those). None for a run saved before they were kept."""
        saved = self._saved_reward_round()
        if saved != start and self.round_record(start).is_file():
            state: dict[str, Any] | None = json.loads(self.round_record(start).read_text()).get(
                "logger"
            )
            return state
        path = self.reward_model_dir / "logger.json"
        return json.loads(path.read_text()) if saved is not None and path.is_file() else None

    def _load_reward_model(self, start: int, inside: bool) -> None:
        """The saved reward model, when it is the one round ``start`` needs: its own (inside its
        RL phase, or fitted already) or the previous round's (to fit on)."""
        saved = self._saved_reward_round()
        allowed = {start} if inside else {start - 1, start}
        if saved is None and (inside or start > 0):
            saved_text = "no reward model"
        elif saved is not None and saved not in allowed:
            saved_text = f"the reward model of round {saved}"
        else:
            saved_text = ""
        if saved_text:
            raise ValueError(
                f"resuming round {start} needs the reward model of round "
                f"{start if inside else start - 1}, but {self.reward_model_dir} holds "
                f"{saved_text} (only the last round's is kept); resume the latest checkpoint "
                "(resume_from_checkpoint='latest')."
            )
        if saved is None:
            return
        state = torch.load(
            self.reward_model_dir / "model.pt", map_location=self.reward_model.device
        )
        self.reward_model.model.load_state_dict(state)
        self.reward_metrics = json.loads((self.reward_model_dir / "metrics.json").read_text())

    # -- evaluation and saving ----------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """The RL phase's evaluation with the task reward (``{}`` without eval_dataset); logged
        in ``<run_dir>/rl`` and returned."""
        n = self.rl_trainer.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        return self.rl_trainer.evaluate_items(n)

    def save_model(self, output_dir: str | Path) -> None:
        """The agents (``agent_i``, adapters alone for adapter agents) as every trainer saves
        them, and ``reward_model/``."""
        super().save_model(output_dir)
        folder = Path(output_dir) / "reward_model"
        # A transformers/PEFT method, which nn.Module types as a Tensor | Module attribute.
        self.reward_model.model.save_pretrained(folder)  # type: ignore[operator]
        self.reward_model.tokenizer.save_pretrained(folder)

    def save_checkpoint(self) -> Path:
        """A checkpoint of the RL phase (the pairs and the reward model are saved as they are
        made)."""
        return self.rl_trainer.save_checkpoint()

    def close(self) -> None:
        self.rl_trainer.close()
        super().close()
