"""The round, written once (stable-baselines3's ``learn``: collect, then update): the items'
rollout tree, the learner's batch of it and its update, the generation backend's sync, and the
round's metrics over the ranks of a launch. The MAGRPO family and the actor-critics are this
loop with their learners; what each adds around the update is a hook."""

from __future__ import annotations

from typing import Any, TypeVar

from cmlrl_agents.foundation.config import SharedConfig
from cmlrl_agents.foundation.distributed import aggregate_metrics, turn_weights
from cmlrl_agents.foundation.rollout import RolloutTree, collect_tree
from cmlrl_agents.learning.learner import RoundLearner
from cmlrl_agents.runs.trainer import IndexedItem, TeamTrainer

__all__ = ["RoundTrainer"]

RoundConfigT = TypeVar("RoundConfigT", bound=SharedConfig)
RoundLearnerT = TypeVar("RoundLearnerT", bound=RoundLearner[Any, Any])


class RoundTrainer(TeamTrainer[RoundConfigT, RoundLearnerT]):
    """A trainer whose round is one rollout tree and one learner update."""

    def _train_round(self, items: list[IndexedItem]) -> tuple[dict[str, float], int]:
        assert self.env is not None, "train() checks for a train_dataset first"
        args, parallel = self.args, self.parallel
        tree = collect_tree(
            self.env,
            self.agents,
            parallel.shard(items, args.items_per_step),  # all of them in one process
            num_generations=self._group_size(),
            sampling=self.agent_sampling,
            joint_mode=self._joint_mode(),
            backend=self.generation_backend,
            sample_key=self.round_key(),
        )
        self._before_update(tree)
        batch = self.learner.batch(tree)
        metrics = self.learner.update(batch)
        self.generation_backend.sync(self.agents)  # a backend with its own weights reloads them
        metrics.update(self._after_update(tree, batch, metrics))
        counts = {level.turn: level.num_joint_actions for level in tree.levels}
        weights = turn_weights(metrics, counts)
        return aggregate_metrics(parallel, metrics, weights), int(parallel.sum(tree.env_steps))

    def _group_size(self) -> int:
        """G: the samples of each agent at each state (the config's ``num_generations``)."""
        raise NotImplementedError

    def _joint_mode(self) -> str:
        """How the agents' G samples pair into joint actions: "aligned" (the MAGRPO family's
        config may say "cross")."""
        return "aligned"

    def _before_update(self, tree: RolloutTree) -> None:
        """Called with the round's tree before the learner sees it (e.g. drawing it)."""

    def _after_update(
        self, tree: RolloutTree, batch: Any, metrics: dict[str, float]
    ) -> dict[str, float]:
        """Called after the update and the sync; returns metrics to log with the round's."""
        return {}
