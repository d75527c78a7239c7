"""What every trainer shares: the team, the task, the training loop, evaluation, checkpoints.

The trainer is the loop: collect a round's rollouts (``_train_round``), hand them to its
``learner`` (a :class:`~cmlrl_agents.learning.learner.Learner`: ``update(batch) -> metrics``,
holding the optimizers and references), log, evaluate and checkpoint. Two collaborators do the
rest: an :class:`~cmlrl_agents.runs.evaluation.Evaluator` (evaluation, which never changes
training) and a :class:`~cmlrl_agents.runs.checkpointer.Checkpointer` (the run folder).

Rounds are ``_items_per_round()`` items in dataset order. An evaluation runs before item 0 of
each epoch and then at the first round boundary at or after every ``eval_interval`` items (a
round is never cut at an eval point: evaluating or not changes no step of training).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from datasets import Dataset, IterableDataset
from transformers import set_seed

from cmlrl_agents.foundation.metrics import reward_postfix
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.learning.schedules import round_sizes
from cmlrl_agents.policies.sampling import row_key
from cmlrl_agents.runs.evaluation import isolated_rng
from cmlrl_agents.runs.logging import ProgressBar
from cmlrl_agents.runs.plotting import plot_metrics
from cmlrl_agents.runs.threads import apply_num_threads
from cmlrl_agents.runs.trainer_base import EVAL_KEYS, ConfigT, LearnerT, TrainerBase
from cmlrl_agents.runs.trainer_checks import (
    resume_target,
    train_kwargs_error,
)

__all__ = ["IndexedItem", "TeamTrainer"]

IndexedItem = tuple[Mapping[str, Any], int | None]
"""A task item and its index in the dataset (None for a given item), as ``collect_tree`` takes
it."""


class TeamTrainer(TrainerBase[ConfigT, LearnerT]):
    """Base of every trainer: the loop, evaluation and checkpoints (module docstring)."""

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
        self._check_trainable()
        self._start_run(resume)
        total, done = self._progress()
        progress = ProgressBar(total, verbose=self.logger.verbose, desc=self.algorithm)
        progress.update(done)
        last = self._train_loop(progress)
        progress.close()
        self._end_run()
        return last

    # -- what a family may replace: the check, the progress and the loop --------------------------
    def _check_trainable(self) -> None:
        if self.env is None:
            raise ValueError(
                f"{type(self).__name__} was built without train_dataset, so train() has no "
                "items to train on (it can evaluate and save_model). Build it with "
                "train_dataset=... and reward_func=... to train."
            )

    def _progress(self) -> tuple[int | None, int]:
        """The progress bar's total (None: unknown) and what a resumed run has done of it."""
        return self._total_items(), self.items_seen

    def _train_loop(self, progress: ProgressBar) -> dict[str, float]:
        """Every round of the run: ``num_train_epochs`` passes over the training items in
        rounds of ``_items_per_round()``, each evaluated when due; the last round's metrics."""
        last: dict[str, float] = {}
        while self.epoch < self.args.num_train_epochs:
            for items in self._rounds(self.epoch_position):
                if self._eval_due(self.epoch_position):
                    self.evaluate_during_training()
                last, steps = self._train_round(items)
                self._advance(len(items), steps, last)
                progress.update(len(items), postfix=reward_postfix(last, self.num_turns))
            self.epoch += 1
            self.epoch_position = 0
        return last

    def _train_round(self, items: list[IndexedItem]) -> tuple[dict[str, float], int]:
        raise NotImplementedError

    def _items_per_round(self) -> int:
        return 1

    def _dataset(self) -> Dataset | IterableDataset | None:
        return None if self.env is None else self.env.spec.dataset

    def _start_run(self, resume: str | Path | None) -> None:
        """Threads, seed, the schedule, then start fresh or load ``resume``'s state; record the
        config the run uses and apply its learning rates (every trainer's ``train`` begins so)."""
        apply_num_threads(self.args.num_threads)
        if self.args.seed is not None:
            set_seed(self.args.seed)  # python, numpy, torch (and CUDA)
        self._prepare_schedule()
        if resume is None:
            self.checkpointer.start_fresh(self.run_id, self.args.overwrite_output_dir)
        else:
            self.load_checkpoint(resume)
        self.logger.record_config(self._run_config())
        self.learner.apply_learning_rates()

    def _advance(self, items: int, env_steps: int, metrics: dict[str, float]) -> None:
        """Count a trained round, log it, and checkpoint when due."""
        self.env_step += env_steps
        self.rounds += 1
        self.items_seen += items
        self.epoch_position += items
        self.logger.logging_steps = self.args.logging_steps  # may change mid-run
        self.logger.log_train(metrics, self.env_step)
        self._maybe_checkpoint(items)

    def _end_run(self) -> None:
        self.logger.flush()
        if self.args.save_steps:
            self.save_checkpoint()
        if self.args.load_best_model_at_end and self.best_metric is not None:
            self.load_best()
        if self.logger.history and self.parallel.is_main:
            plot_metrics(self.run_dir)

    def _prepare_schedule(self) -> None:
        """Give the learner the run's rounds (their item counts), which its learning-rate
        schedule spans; unknown (None) for a stream or without a train_dataset."""
        data = self._dataset()
        rounds = None
        if isinstance(data, Dataset):
            rounds = list(round_sizes(len(data), self._items_per_round()))
            rounds *= self.args.num_train_epochs
        self.learner.schedule(rounds)

    def _total_items(self) -> int | None:
        data = self._dataset()
        return len(data) * self.args.num_train_epochs if isinstance(data, Dataset) else None

    def _rounds(self, skip: int) -> Iterator[list[IndexedItem]]:
        """The epoch's rounds of ``_items_per_round()`` items in dataset order from ``skip``
        (the position a resumed run restores)."""
        assert self.env is not None, "train() checks for a train_dataset first"
        size = self._items_per_round()
        batch: list[IndexedItem] = []
        for index, item in self.env.epoch_items(self.epoch + 1, skip, name="train_dataset"):
            batch.append((item, index))
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch

    def _eval_due(self, position: int) -> bool:
        """At item 0 of each epoch, and at the first round boundary at or after each multiple
        of ``eval_interval`` (the boundary at ``position`` follows one of a full round)."""
        interval = self.args.eval_interval
        if not interval:
            return False
        if position == 0:
            return True
        return position // interval > (position - self._items_per_round()) // interval

    # -- evaluation ---------------------------------------------------------------------------
    def evaluate_items(self, num_eval_samples: int) -> dict[str, float]:
        """One response per agent per turn (every turn) on the first ``num_eval_samples`` eval
        items, drawn from the run's eval sampling key (the same weights evaluate to the same
        numbers); no global random stream changes (see ``evaluation.py``)."""
        if self.eval_env is None:
            return {}
        if (
            isinstance(num_eval_samples, bool)
            or not isinstance(num_eval_samples, int)
            or num_eval_samples < 1
        ):
            raise ValueError(f"num_eval_samples must be a positive int, got {num_eval_samples!r}.")
        items = list(self.eval_env.epoch_items(None, 0, num_eval_samples, name="eval_dataset"))
        # One eval key for the whole run: every evaluation draws its samples alike (common random
        # numbers), so two evaluations differ by what the weights changed, not by the draw.
        key = row_key(self.sample_seed, EVAL_KEYS)
        with isolated_rng():
            trees = self.evaluator.trees(items, self.args.eval_batch_size, self.agent_sampling, key)
            metrics = self.evaluator.metrics(trees, self.args.discount)
            custom = self._custom_eval_metrics(trees)
        metrics.update({f"eval/{k}": v for k, v in custom.items()})
        self.logger.log_eval(metrics, self.env_step)
        return metrics

    def evaluate_during_training(self) -> dict[str, float]:
        """A scheduled evaluation; with ``save_best_by`` it keeps the best model so far."""
        metrics = self.evaluate_items(self.args.eval_num_samples)
        if self.args.save_best_by is not None:
            self.track_best(metrics)
        return metrics

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        """Trainer-specific evaluation metrics (without the ``eval/`` prefix)."""
        return {}

    def _maybe_checkpoint(self, added: int) -> None:
        every = self.args.save_steps
        if every and self.items_seen // every != (self.items_seen - added) // every:
            self.save_checkpoint()

    def save_checkpoint(self) -> Path:
        """``run_dir/checkpoints/checkpoint-<items seen>``: weights, optimizers, every rank's
        RNG, position, metric history, the config and the run's identity, written atomically;
        the newest ``save_total_limit`` are kept. With ``save_only_model`` the weights alone (a
        fraction of the size: no AdamW state), which cannot be resumed.

        Frozen reference models are not saved: they are the initial weights, which the trainer
        that resumes is built from again.
        """
        self._prepare_schedule()
        return self.checkpointer.save(
            self.items_seen,
            self.learner,
            self._run_state(),
            keep_last=self.args.save_total_limit,
            weights_only=self.args.save_only_model,
        )

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore a checkpoint folder, or ``"latest"`` under this run's ``checkpoints/``.

        Every file is verified and the run identity compared before anything changes: a
        refused or damaged checkpoint leaves the trainer as it was.
        """
        path = self.checkpointer.resolve(path)
        if not self.logger.fresh:  # before anything changes: the run's log restarts from its own
            raise RuntimeError(
                f"this trainer has already logged (an evaluate() or train() call), so it cannot "
                f"resume {path}: the run's metrics would mix with its own. Resume with a new "
                "trainer built with the same arguments."
            )
        self._prepare_schedule()  # the schedulers exist before their state is loaded
        state = self.checkpointer.load(path, self.learner, lambda s: self._check_state(s, path))
        self.run_id = state["run"]["run_id"]
        self.load_counters(state)
        self.logger.load_state_dict(state["logger"])
        self.learner.apply_learning_rates()
        self.generation_backend.sync(self.agents)  # the restored weights, also in the backend

    def track_best(self, metrics: Mapping[str, float]) -> None:
        """Keep the weights of the best ``save_best_by`` value so far in ``run_dir/best/``."""
        name = self.args.save_best_by
        if name is None or name not in metrics:
            raise ValueError(
                f"save_best_by={name!r} is not a metric of this evaluation "
                f"({sorted(metrics)}); name one of them."
            )
        value, best = metrics[name], self.best_metric
        if best is None or (value > best if self.args.greater_is_better else value < best):
            self.best_metric = value
            self.checkpointer.save(
                self.items_seen, self.learner, self._run_state(), keep_last=1, best=True
            )

    def load_best(self) -> Path:
        """Load the weights kept by ``save_best_by`` (its folder under ``run_dir/best/``), e.g.
        before ``save_model``; returns the folder."""
        return self.load_weights(self.checkpointer.best_path())

    def load_weights(self, path: str | Path) -> Path:
        """Load the trained weights alone of a checkpoint folder (any: a full one, a
        ``save_only_model`` one, or the best model's), checked like a resume's, to evaluate or
        export them, with the run's sampling seed (evaluation then draws as the run's did); the
        optimizers and the epoch position stay as they are. A trainer that has logged nothing
        yet (``cmlrl eval``) takes the checkpoint's env_step too, so its evaluation logs at the
        step the weights were trained to; one that has logged keeps its own, so its log stays
        in order (after ``load_best_model_at_end`` a final evaluation logs at the run's end)."""
        path = self.checkpointer.resolve(path)
        state = self.checkpointer.load(
            path, self.learner, lambda s: self._check_state(s, path), weights_only=True
        )
        self.sample_seed = state["sample_seed"]
        if self.logger.fresh:
            self.env_step = state["env_step"]
        self.generation_backend.sync(self.agents)
        return path

    def _run_state(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "run": {"run_id": self.run_id, "identity": self._identity()},
            **self.state_counters(),
            "logger": self.logger.state_dict(),
            "config": self.args.to_dict(),
        }
