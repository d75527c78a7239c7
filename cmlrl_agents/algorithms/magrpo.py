"""``MAGRPOTrainer`` and its REINFORCE-family siblings (MAREINFORCE, MAReMax, MARLOO).

The trainer is the loop: one round rolls out ``rollout_buffer_size`` task items through the
env's tree (one batched generate per agent and turn) and hands the tree to its
:class:`~cmlrl_agents.algorithms.policy_gradient.PolicyGradientLearner` (``trainer.learner``),
whose public
``update(tree)`` computes the returns and sibling-group advantages and steps every agent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Unpack

from cmlrl_agents._checks import finite_metrics
from cmlrl_agents.algorithms.magrpo_config import (
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)
from cmlrl_agents.algorithms.policy_gradient import PolicyGradientLearner
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.runs.round_trainer import RoundTrainer
from cmlrl_agents.runs.trainer_keywords import TeamKeywords
from cmlrl_agents.runs.tree_plot import save_rollout_tree
from cmlrl_agents.runs.tree_view import rollout_tree_view

__all__ = [
    "MAGRPOTrainer",
    "MAREINFORCETrainer",
    "MAReMaxTrainer",
    "MARLOOTrainer",
    "eval_chains",
]


def eval_chains(tree: RolloutTree) -> list[list[list[str]]]:
    """Completions of a one-sample-per-turn tree as ``[agent][item][turn]``."""
    chains: list[list[list[str]]] = [[[] for _ in tree.items] for _ in range(tree.num_agents)]
    for level in tree.levels:
        for branch, slot in enumerate(level.item_slot):
            for a in range(tree.num_agents):
                chains[a][slot].append(level.completions[a][branch][0].text)
    return chains


def level_chains(
    tree: RolloutTree, index: int
) -> tuple[list[list[list[str]]], list[Mapping[str, Any]]]:
    """Every joint action of level ``index`` as a chain per agent, ``[agent][joint
    action][turn]`` (the texts of the joint actions it follows, then its own; branch-major),
    and each chain's task item."""
    chains: list[list[list[str]]] = [[] for _ in range(tree.num_agents)]
    items: list[Mapping[str, Any]] = []
    last = tree.levels[index]
    for branch in range(len(last.states)):
        for joint in range(len(last.joints)):
            path, b, j = [], branch, joint  # (level, branch, joint) back to turn 1
            for i in range(index, -1, -1):
                path.append((tree.levels[i], b, j))
                if i > 0:
                    b, j = divmod(tree.levels[i].parent[b], len(tree.levels[i - 1].joints))
            for a in range(tree.num_agents):
                texts = [lv.completions[a][lb][lv.joints[lj][a]].text for lv, lb, lj in path]
                chains[a].append(texts[::-1])
            items.append(tree.items[last.item_slot[branch]][0])
    return chains, items


class MAGRPOTrainer(RoundTrainer[MAGRPOConfig, PolicyGradientLearner]):
    """Multi-agent GRPO over ``CoMLRLEnv`` (SPEC §5–§6).

    Construct with ``agent_model="<hub id or folder>"`` (one copy per agent, or with
    ``peft_config=LoraConfig(...)`` one LoRA adapter per agent over one shared base) or
    ``agents=[model, ...]`` plus ``tokenizer=``; the task as ``train_dataset``, ``formatters``,
    ``reward_func`` (``reward_processor``, ``external_transition``), as one ``task=TaskSpec(...)``
    or as a ready ``env=``.
    """

    algorithm = "magrpo"
    config_class: type[MAGRPOConfig] = MAGRPOConfig
    fixed_fields = (*RoundTrainer.fixed_fields, "reference_kl_enabled")

    def __init__(
        self,
        agent_model: Any = None,
        *,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: MAGRPOConfig | None = None,
        **team: Unpack[TeamKeywords],
    ) -> None:
        args = self.config_class() if args is None else args
        if not isinstance(args, MAGRPOConfig):
            raise TypeError(
                f"args must be a MAGRPOConfig (or a REINFORCE-family config), got "
                f"{type(args).__name__}."
            )
        if (eval_logger is None) != (eval_aggregator is None):
            raise ValueError("eval_logger and eval_aggregator work together: pass both or neither.")
        super().__init__(args=args, agent_model=agent_model, **team)
        self.eval_logger = eval_logger
        self.eval_aggregator = eval_aggregator
        self.learner = PolicyGradientLearner(self.agents, args, self.num_turns)

    def evaluate(self, num_eval_samples: int | None = None) -> dict[str, float]:
        """Evaluate on the first ``num_eval_samples`` eval items (default
        ``args.eval_num_samples``); ``{}`` without an eval dataset."""
        n = self.args.eval_num_samples if num_eval_samples is None else num_eval_samples
        return self.evaluate_items(n)

    def _items_per_round(self) -> int:
        return self.args.rollout_buffer_size

    def _identity(self) -> dict[str, Any]:
        return {**super()._identity(), "num_generations": self.args.num_generations}

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        """``eval_aggregator(eval_logger(...), num_turns=T)`` over every evaluated item."""
        if self.eval_logger is None or self.eval_aggregator is None:
            return {}
        completions: list[list[list[str]]] = [[] for _ in range(self.num_agents)]
        items: list[Mapping[str, Any]] = []
        for tree in trees:
            chains = eval_chains(tree)
            for a in range(self.num_agents):
                completions[a].extend(chains[a])
            items.extend(item for item, _ in tree.items)
        rows = self.eval_logger(
            agent_completions_turns=completions,
            batch_items=items,
            prompts=[item.get("prompt") for item in items],
        )
        return finite_metrics(
            self.eval_aggregator(rows, num_turns=self.num_turns), "eval_aggregator"
        )

    # -- one round (runs/round_trainer.py) ----------------------------------------------------
    def _group_size(self) -> int:
        return self.args.num_generations

    def _joint_mode(self) -> str:
        return self.args.joint_mode

    def _before_update(self, tree: RolloutTree) -> None:
        args = self.args
        # self.rounds: the run's rounds before this one (a resumed run's included).
        plot = args.tree_plot_interval and self.rounds % args.tree_plot_interval == 0
        if plot:  # every rank: the view may sum the round's return moments over ranks
            self.save_tree(tree)

    def _after_update(
        self, tree: RolloutTree, batch: Any, metrics: dict[str, float]
    ) -> dict[str, float]:
        if self.args.log_train_levels and self.eval_logger is not None:
            return self._train_level_metrics(tree)
        return {}

    def _train_level_metrics(self, tree: RolloutTree) -> dict[str, float]:
        """The means of ``eval_logger``'s ``turn_k/`` values over level k's joint actions, for
        each level of the round's tree (``log_train_levels``)."""
        assert self.eval_logger is not None
        out: dict[str, float] = {}
        for index, level in enumerate(tree.levels):
            chains, items = level_chains(tree, index)
            rows = self.eval_logger(
                agent_completions_turns=self._logged_roles(chains),
                batch_items=items,
                prompts=[item.get("prompt") for item in items],
            )
            prefix = f"turn_{level.turn}/"
            values: dict[str, list[float]] = {}
            for row in rows:
                for key, value in row.items():
                    if key.startswith(prefix) and isinstance(value, (int, float)):
                        values.setdefault(key, []).append(float(value))
            out.update({key: sum(v) / len(v) for key, v in values.items()})
        return finite_metrics(out, "eval_logger")

    def _logged_roles(self, chains: list[list[list[str]]]) -> list[list[list[str]]]:
        """What ``eval_logger`` reads for these chains: the agents' own texts."""
        return chains

    def save_tree(self, tree: RolloutTree) -> dict[str, Path]:
        """Draw the first item of ``tree`` with this trainer's return and advantage settings
        into ``run_dir/trees/env_step-<E>`` (``.json``, ``.html`` and, unless the tree is too big
        for one image, ``.png``); returns the paths by suffix. Under data parallel every rank
        calls it (with ``advantage_normalization="batch"`` the view's std is the whole round's,
        one all-reduce) and rank 0 writes; the others return ``{}``."""
        args = self.args
        view = rollout_tree_view(
            tree,
            discount=args.discount,
            advantage_mode=args.advantage_mode,
            advantage_normalization=args.advantage_normalization,
            env_step=self.env_step,
            sum_over_ranks=self.parallel.sum_vector,
        )
        if not self.parallel.is_main:
            return {}
        return save_rollout_tree(view, self.run_dir / "trees" / f"env_step-{self.env_step:06d}")


class MAREINFORCETrainer(MAGRPOTrainer):
    algorithm = "mareinforce"
    config_class = MAREINFORCEConfig


class MAReMaxTrainer(MAGRPOTrainer):
    algorithm = "maremax"
    config_class = MAReMaxConfig


class MARLOOTrainer(MAGRPOTrainer):
    algorithm = "marloo"
    config_class = MARLOOConfig
