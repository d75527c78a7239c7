"""One task item's rollout tree as plain numbers and texts: what MAGRPO saw in one round.

``rollout_tree_view`` walks a :class:`~cmlrl_agents.foundation.rollout.RolloutTree` and, for one
item, lists every joint action (a node) with each agent's prompt and completion, the reward, the
return (reward + ``discount`` × mean return of the children) and each agent's advantage over its G
siblings. The numbers come from the functions the update calls (``joint_returns``,
``agent_returns`` and ``sibling_advantages`` of ``learning/credit.py``), so the picture drawn
from a view (``cmlrl_agents.runs.tree_plot``) shows exactly what the update used.

A view is plain data: it round-trips through JSON (``save`` / ``load``), which is what the
trainer writes to ``run_dir/trees/`` and what ``cmlrl plot`` draws again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from torch import Tensor

from cmlrl_agents.foundation.rollout import Level, RolloutTree
from cmlrl_agents.functional.advantages import BASELINES
from cmlrl_agents.learning.credit import (
    advantage_scale,
    agent_returns,
    joint_returns,
    round_stds,
    sibling_advantages,
)

__all__ = ["TreeNode", "TreeView", "rollout_tree_view"]


@dataclass(frozen=True)
class TreeNode:
    """One joint action of the tree.

    ``parent`` is the ``id`` of the joint action whose state this one was sampled from (None at
    turn 1); ``sample`` is each agent's sample index among its G siblings; ``ended_early`` means
    the reward passed ``early_termination_threshold`` before the last turn, so the branch stopped.
    """

    id: int
    parent: int | None
    turn: int
    sample: tuple[int, ...]
    prompts: tuple[str, ...]
    completions: tuple[str, ...]
    reward: float
    turn_return: float
    advantages: tuple[float, ...]
    ended_early: bool


@dataclass(frozen=True)
class TreeView:
    """Every node of one item's tree, parents before children, and the settings behind them."""

    item_index: int | None
    num_agents: int
    num_turns: int
    """Levels in the tree: the turns played (fewer than the task's when every branch ended)."""
    num_generations: int
    discount: float
    advantage_mode: str
    advantage_scale: str
    """What the advantages were divided by: "group", "batch" or "none" (see SCALES)."""
    nodes: tuple[TreeNode, ...]
    env_step: int | None = None
    """The trainer's ``env_step`` when the round began (None outside a trainer)."""

    def children(self, node_id: int | None) -> list[TreeNode]:
        """The nodes sampled from the state ``node_id`` led to (``None``: the turn-1 nodes)."""
        return [n for n in self.nodes if n.parent == node_id]

    @property
    def num_leaves(self) -> int:
        """Nodes without children: ended branches and the last turn's joint actions."""
        parents = {n.parent for n in self.nodes}
        return sum(1 for n in self.nodes if n.id not in parents)

    @property
    def root_prompts(self) -> tuple[str, ...]:
        """Each agent's turn-1 prompt (the formatted task item)."""
        return self.nodes[0].prompts

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TreeView:
        """The inverse of :meth:`to_dict`; a missing or unknown key raises ``ValueError``."""
        _check_keys("tree view", data, {f.name for f in fields(cls)})
        node_keys = {f.name for f in fields(TreeNode)}
        nodes = []
        for i, raw in enumerate(data["nodes"]):
            _check_keys(f"node {i}", raw, node_keys)
            values: dict[str, Any] = {
                k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in node_keys
            }
            nodes.append(TreeNode(**values))
        return cls(**{**data, "nodes": tuple(nodes)})

    def save(self, path: str | Path) -> Path:
        """Write the view as JSON (floats exact) and return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1, ensure_ascii=False), "utf-8")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TreeView:
        """Read a view written by :meth:`save`."""
        path = Path(path)
        try:
            data = json.loads(path.read_text("utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(
                f"{path} is not a rollout-tree JSON file ({exc}); the trainer writes them to "
                "run_dir/trees/*.json when tree_plot_interval > 0."
            ) from exc
        if not isinstance(data, dict):
            raise ValueError(f"{path} holds a {type(data).__name__}, not a rollout-tree view.")
        return cls.from_dict(data)


def _check_keys(what: str, data: Any, expected: set[str]) -> None:
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object, got {type(data).__name__}.")
    required = expected - {"env_step"}
    missing, unknown = sorted(required - data.keys()), sorted(data.keys() - expected)
    if missing or unknown:
        raise ValueError(f"{what}: missing keys {missing}, unknown keys {unknown}.")


def _level_nodes(
    level: Level,
    item_slot: int,
    joint_returns: Tensor,
    advantages: list[Tensor],
    parent_ids: dict[int, int],
    nodes: list[TreeNode],
    budget_left: bool,
) -> dict[int, int]:
    """Append the item's joint actions of ``level`` to ``nodes``; their ids by flat index."""
    ids: dict[int, int] = {}
    for branch, slot in enumerate(level.item_slot):
        if slot != item_slot:
            continue
        parent = None if level.parent[branch] < 0 else parent_ids[level.parent[branch]]
        for j, sample in enumerate(level.joints):
            outcome = level.outcomes[branch][j]
            ids[branch * len(level.joints) + j] = len(nodes)
            nodes.append(
                TreeNode(
                    id=len(nodes),
                    parent=parent,
                    turn=level.turn,
                    sample=tuple(sample),
                    prompts=tuple(level.states[branch].prompts),
                    completions=tuple(
                        level.completions[a][branch][g].text for a, g in enumerate(sample)
                    ),
                    reward=float(outcome.reward),
                    turn_return=float(joint_returns[branch, j]),
                    advantages=tuple(float(advantages[a][branch, g]) for a, g in enumerate(sample)),
                    # Every branch terminates at the last turn; before it, termination means
                    # the reward passed early_termination_threshold.
                    ended_early=budget_left and outcome.terminated,
                )
            )
    return ids


def rollout_tree_view(
    tree: RolloutTree,
    *,
    item_slot: int = 0,
    discount: float = 1.0,
    advantage_mode: str = "mean",
    advantage_normalization: bool | str = True,
    env_step: int | None = None,
    sum_over_ranks: Callable[[list[float]], list[float]] | None = None,
) -> TreeView:
    """The view of item ``item_slot`` (its position in the round's batch) of ``tree``.

    ``discount``, ``advantage_mode`` and ``advantage_normalization`` are the trainer's settings
    (``MAGRPOConfig`` fields); the defaults are MAGRPO's. With "batch" the std is over this
    tree's round; when the round is split across ranks, ``sum_over_ranks`` (the trainer's
    ``parallel.sum_vector``, an all-reduce every rank must join) makes it the whole round's, as
    the update trained on (``credit.round_stds``).
    """
    if isinstance(item_slot, bool) or not isinstance(item_slot, int):
        raise TypeError(f"item_slot must be an int, got {item_slot!r}.")
    if not 0 <= item_slot < len(tree.items):
        raise ValueError(
            f"item_slot={item_slot} but the tree holds {len(tree.items)} items; pass 0 to "
            f"{len(tree.items) - 1}."
        )
    if advantage_mode not in BASELINES:
        raise ValueError(f"advantage_mode must be one of {BASELINES}, got {advantage_mode!r}.")
    if not tree.levels:
        raise ValueError("the tree has no level: collect_tree(...) played no turn.")
    returns = joint_returns(tree, discount)
    credit = agent_returns(tree, returns)
    nodes: list[TreeNode] = []
    ids: dict[int, int] = {}  # the previous level's flat joint-action index -> node id
    scale = advantage_scale(advantage_normalization)
    stds = round_stds(credit, scale, tree.num_agents, tree.num_turns, sum_over_ranks)
    by_agent = [
        sibling_advantages(credit, a, advantage_mode, scale, None if stds is None else stds[a])
        for a in range(tree.num_agents)
    ]
    for t, (level, joint) in enumerate(zip(tree.levels, returns, strict=True)):
        advantages = [agent_advantages[t] for agent_advantages in by_agent]
        budget_left = level.turn < tree.num_turns
        ids = _level_nodes(level, item_slot, joint, advantages, ids, nodes, budget_left)
    _, item_index = tree.items[item_slot]
    return TreeView(
        item_index=item_index,
        num_agents=tree.num_agents,
        num_turns=max(level.turn for level in tree.levels),
        num_generations=tree.num_generations,
        discount=float(discount),
        advantage_mode=advantage_mode,
        advantage_scale=scale,
        nodes=tuple(nodes),
        env_step=env_step,
    )
