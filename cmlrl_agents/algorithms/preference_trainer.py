"""What the preference trainers (MADPO, MARLHF) share: the pair sources and pair building.

Pairs come from the current policy: every training item's agents sample
``preference_num_candidates`` aligned joint candidates through the env (``collect_tree``, one
batched generate per agent for ``rollout_buffer_size`` items), which are labelled by the task
reward, a ``preference_func`` or a comparator
(:class:`~cmlrl_agents.algorithms.preference_pairs.PairLabeler`). A ``pairs_file`` (JSON lines, e.g.
human labels) gives the first round's pairs instead. Each round's pairs are written to
``<run_dir>/preference/pairs-<round>.jsonl``; a resumed run and replay read them back.

``env_step`` counts joint candidates scored by the env (each one joint action); training on
pairs scores none, so it does not advance ``env_step``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from cmlrl_agents.algorithms.preference_config import PreferenceConfig
from cmlrl_agents.algorithms.preference_pairs import (
    PairLabeler,
    PreferencePair,
    load_pairs,
    pairs_from_tree,
    save_pairs,
)
from cmlrl_agents.foundation.metrics import turn_key
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.sampling import row_key
from cmlrl_agents.runs.trainer import TeamTrainer
from cmlrl_agents.runs.trainer_base import PAIR_KEYS, LearnerT
from cmlrl_agents.runs.trainer_keywords import check_team_keywords

__all__ = ["PreferenceTrainer", "no_task_reward", "preference_team"]


def no_task_reward(*completions: list[str]) -> list[float]:
    """The env's reward when pairs come from a judge and no task reward was given: 0 for every
    joint response (never logged as a reward, never used for evaluation)."""
    return [0.0] * len(completions[0])


def check_sources(
    reward_func: Any, preference_func: Any, comparator: Any, pairs_file: Any, eval_dataset: Any
) -> None:
    """One way to label pairs, and a task reward wherever one is needed."""
    for name, value in (("preference_func", preference_func), ("comparator", comparator)):
        if value is not None and not callable(value):
            raise TypeError(
                f"{name} must be callable(joint_a, joint_b, item) -> 1 | 0 | -1, got {value!r}."
            )
    if preference_func is not None and comparator is not None:
        raise ValueError(
            "pass preference_func or comparator, not both: each labels every pair on its own."
        )
    if reward_func is None and preference_func is None and comparator is None and not pairs_file:
        raise ValueError(
            "no preference source: pass reward_func (pairs ranked by task reward), "
            "preference_func=..., comparator=... or pairs_file='pairs.jsonl'."
        )
    if reward_func is None and eval_dataset is not None:
        raise ValueError(
            "eval_dataset is given but reward_func is not: evaluation scores the policy with the "
            "task reward. Pass reward_func=..., or drop eval_dataset."
        )


def preference_team(
    team: Mapping[str, Any],
    trainer: str,
    *,
    preference_func: Any,
    comparator: Any,
    pairs_file: Any,
    num_iterations: int,
) -> tuple[dict[str, Any], bool]:
    """The team keywords of a preference trainer checked (single-turn: no
    ``external_transition``) with its pair sources; without a task reward the env gets
    :func:`no_task_reward`. Returns the keywords for ``TeamTrainer`` and whether a task reward
    was given."""
    check_team_keywords(team, trainer, refused=("external_transition",))
    env, reward_func = team.get("env"), team.get("reward_func")
    spec = team.get("task") if env is None else env.spec
    if spec is not None and spec.num_turns != 1:
        raise ValueError(
            f"{'env' if env is not None else 'task'} has num_turns={spec.num_turns}: {trainer} "
            "compares single-turn joint responses; give it a one-turn task (multi-turn tasks: "
            "MAGRPOTrainer, IACTrainer)."
        )
    task_reward = reward_func if spec is None else spec.reward_func
    check_sources(task_reward, preference_func, comparator, pairs_file, team.get("eval_dataset"))
    dataset = team.get("train_dataset") if spec is None else spec.dataset
    labels = task_reward is not None or preference_func is not None or comparator is not None
    if pairs_file and num_iterations > 1 and not (dataset is not None and labels):
        raise ValueError(
            f"num_iterations={num_iterations}: rounds after the first build pairs from the "
            "policy, which needs train_dataset and a way to label them (reward_func, "
            "preference_func or comparator); the pairs_file gives round 0 only. Pass them, or "
            "set num_iterations=1."
        )
    team = dict(team)
    if spec is None and team.get("train_dataset") is not None and reward_func is None:
        team["reward_func"] = no_task_reward  # the env is built; pairs need none
    return team, task_reward is not None


PreferenceConfigT = TypeVar("PreferenceConfigT", bound=PreferenceConfig)


class PreferenceTrainer(TeamTrainer[PreferenceConfigT, LearnerT]):
    """A :class:`TeamTrainer` whose rounds start by building preference pairs."""

    def setup_preferences(
        self,
        *,
        has_task_reward: bool,
        preference_func: Callable[..., Any] | None,
        comparator: Callable[..., Any] | None,
        pairs_file: str | Path | None,
    ) -> None:
        """Bind the pair source (called by the subclasses' ``__init__`` after ``super``)."""
        args = self.args
        self.has_task_reward = has_task_reward
        judge, name = preference_func, "preference_func"
        if comparator is not None:
            judge, name = comparator, f"comparator {type(comparator).__name__}"
        self.labeler = PairLabeler(
            selection=args.pair_selection,
            max_pairs=args.preference_pairs_per_sample,
            judge=judge,
            name=name if judge is not None else "task reward",
            seed=args.seed,
        )
        self.pairs_file = None if pairs_file is None else Path(pairs_file)
        self.agent_names = [f"agent_{i}" for i in range(self.num_agents)]
        if self.pairs_file is not None:  # read now: a bad file fails before any training
            self.file_pairs = load_pairs(self.pairs_file, self.agent_names)

    def pairs_path(self, round_index: int) -> Path:
        return self.run_dir / "preference" / f"pairs-{round_index:03d}.jsonl"

    def round_pairs(self, round_index: int) -> list[PreferencePair]:
        """The round's pairs: the file's (round 0), or built from the current policy; written
        to :meth:`pairs_path`."""
        if round_index == 0 and self.pairs_file is not None:
            pairs = list(self.file_pairs)
            self.logger.log_now({"preference/pairs": float(len(pairs))}, self.env_step)
        else:
            pairs = self.build_pairs(round_index)
        if self.parallel.is_main:
            save_pairs(self.pairs_path(round_index), pairs, self.agent_names)
        self.parallel.barrier()
        return pairs

    def saved_pairs(self, round_index: int) -> list[PreferencePair]:
        """A round's pairs as this run wrote them (resume, replay)."""
        return load_pairs(self.pairs_path(round_index), self.agent_names)

    def replay_rounds(self, round_index: int) -> range:
        """The last ``replay_iterations`` rounds before ``round_index``."""
        return range(max(0, round_index - self.args.replay_iterations), round_index)

    def replay_pairs(self, round_index: int) -> list[PreferencePair]:
        """The pairs of the :meth:`replay_rounds` of ``round_index``, as saved."""
        return [p for j in self.replay_rounds(round_index) for p in self.saved_pairs(j)]

    def build_pairs(self, round_index: int) -> list[PreferencePair]:
        """Sample K joint candidates per training item from the current policy and label them."""
        if self.env is None:
            raise ValueError(
                f"round {round_index} builds pairs from the policy, which needs train_dataset "
                "(and reward_func, preference_func or comparator); the pairs_file gives round 0 "
                "only. Pass train_dataset=..., or set num_iterations=1."
            )
        args, size = self.args, self.args.rollout_buffer_size
        # The run's seed (args.seed, or the one drawn for seed=None and kept by checkpoints),
        # so a resumed unseeded run draws the pairs an uninterrupted one would have.
        self.labeler.seed = self.sample_seed
        self.labeler.start_round(round_index)
        items = [
            (item, index)
            for index, item in self.env.epoch_items(round_index + 1, 0, name="train_dataset")
        ]
        pairs: list[PreferencePair] = []
        rewards: list[float] = []
        parallel, key = self.parallel, row_key(self.sample_seed, PAIR_KEYS, round_index)
        for start in range(0, len(items), size):
            tree = collect_tree(
                self.env,
                self.agents,
                parallel.shard(items[start : start + size], size),  # all in one process
                num_generations=args.preference_num_candidates,
                sampling=self.agent_sampling,
                backend=self.generation_backend,
                sample_key=key,
            )
            self.env_step += int(parallel.sum(tree.env_steps))
            local = [float(r) for level in tree.levels[:1] for r in level.rewards.reshape(-1)]
            # Every rank gets every rank's pairs, in item order: the round's one set of pairs.
            for got, scores in parallel.gather((pairs_from_tree(tree, self.labeler), local)):
                pairs.extend(got)
                rewards.extend(scores)
        if not pairs:
            raise ValueError(self._no_pairs_message(round_index, len(items)))
        metrics = self._pair_metrics(round_index, pairs)
        if self.has_task_reward:  # the candidates' task reward: the seed's training metrics
            mean = sum(rewards) / len(rewards)
            metrics[turn_key(1, "reward_mean")] = metrics[turn_key(1, "expected_return")] = mean
        self.logger.log_now(metrics, self.env_step)
        return pairs

    def _no_pairs_message(self, round_index: int, num_items: int) -> str:
        k = self.args.preference_num_candidates
        why = (
            "got the same task reward (all ties)"
            if self.labeler.judge is None
            else f"were judged ties (0) by the {self.labeler.name}"
        )
        return (
            f"round {round_index} found no preference pair: on all {num_items} training items the "
            f"{k} joint candidates {why}. Raise preference_num_candidates or temperature, use a "
            "reward with finer grades, or give labelled pairs (preference_func, pairs_file)."
        )

    def _pair_metrics(self, round_index: int, pairs: list[PreferencePair]) -> dict[str, float]:
        metrics = {"preference/iteration": float(round_index), "preference/pairs": len(pairs)}
        if self.has_task_reward and self.labeler.judge is None:
            # The task reward labelled every pair, so each has both rewards.
            gaps = [p.chosen_reward - p.rejected_reward for p in pairs]  # type: ignore[operator]
            metrics["preference/reward_gap_mean"] = sum(gaps) / len(gaps)
        return {k: float(v) for k, v in metrics.items()}

    # -- shared trainer plumbing ------------------------------------------------------------------
    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """One response per agent on the first ``num_eval_samples`` eval items (default
        ``args.eval_num_samples``), scored with the task reward; ``{}`` without eval_dataset."""
        n = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        return self.evaluate_items(n)

    def eval_due(self, round_index: int) -> bool:
        """Before every ``eval_interval``-th round (round 0 included)."""
        interval = self.args.eval_interval
        return bool(interval) and round_index % interval == 0

    def _prepare_schedule(self) -> None:
        self.learner.schedule(None)

    def _identity(self) -> dict[str, Any]:
        return {
            **super()._identity(),
            "preference_num_candidates": self.args.preference_num_candidates,
        }
