"""Rollouts: the one place where the env and the policies meet.

``collect_tree`` plays a batch of task items level by level (turn by turn). At each level every
agent answers every open branch of every item in ONE batched ``generate`` call (G samples per
branch; adapter agents of one base share one call, see :mod:`cmlrl_agents.policies.generation`), and
the env scores each item's joint actions with one ``reward_func`` call
(``CoMLRLEnv.step_group``, which applies the env's checks before the pure ``Task.step_group``);
each joint action that goes on becomes a child branch of the next level. Evaluation is the same
walk with G = 1: one response per agent per turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from cmlrl_agents.policies.agent import Completion, SamplingConfig
from cmlrl_agents.policies.generation import GenerationBackend, GenerationRequest, HFGenerate
from cmlrl_agents.policies.sampling import row_key
from cmlrl_env.core import EpisodeState, Outcome

__all__ = ["GroupStepEnv", "Policy", "Level", "RolloutTree", "collect_tree", "joint_indices"]


class GroupStepEnv(Protocol):
    """What ``collect_tree`` steps: a ``CoMLRLEnv`` (the trainers: its length limits and action
    checks apply) or its pure core ``Task`` (no limits; demos and tests of the tree itself)."""

    @property
    def num_turns(self) -> int: ...

    def initial_state(
        self, item: Mapping[str, Any], item_index: int | None = None
    ) -> EpisodeState: ...

    def step_group(
        self, states: Sequence[EpisodeState], joint_actions: Sequence[Sequence[Sequence[str]]]
    ) -> list[list[Outcome]]: ...


class Policy(Protocol):
    """What ``collect_tree`` asks of an agent. ``keys`` (one sampling key per prompt and
    sample) is passed only when the rollout has a ``sample_key``."""

    def generate(
        self, prompts: list[str], num_samples: int, sampling: SamplingConfig, keys: Any = None
    ) -> list[list[Completion]]: ...


def joint_indices(num_agents: int, num_generations: int, joint_mode: str) -> list[tuple[int, ...]]:
    """Which sample of each agent forms joint action j.

    aligned: j pairs sample j of every agent (G joint actions); cross: every combination in
    ``itertools.product`` order, agent 0 slowest (G**N joint actions).
    """
    if joint_mode == "aligned" or num_agents == 1:
        return [(g,) * num_agents for g in range(num_generations)]
    if joint_mode == "cross":
        return list(itertools.product(range(num_generations), repeat=num_agents))
    raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {joint_mode!r}.")


@dataclass
class Level:
    """One turn of the tree across all items of the batch.

    ``completions[agent][branch][g]``; ``outcomes[branch][j]`` for joint action ``joints[j]``;
    ``parent[branch]`` indexes the previous level's flattened joint actions (-1 at turn 1).
    """

    turn: int
    states: list[EpisodeState]
    item_slot: list[int]
    parent: list[int]
    completions: list[list[list[Completion]]]
    joints: list[tuple[int, ...]]
    outcomes: list[list[Outcome]]

    @property
    def rewards(self) -> Tensor:
        """``[branches, J]`` processed rewards."""
        return torch.tensor([[o.reward for o in row] for row in self.outcomes], dtype=torch.float32)

    @property
    def num_joint_actions(self) -> int:
        return len(self.states) * len(self.joints)


@dataclass
class RolloutTree:
    """All levels of one batch of task items."""

    items: list[tuple[Mapping[str, Any], int | None]]
    num_agents: int
    num_generations: int
    num_turns: int
    """The task's turns: a branch that ended early did not play ``num_turns - turn`` of them."""
    levels: list[Level] = field(default_factory=list)

    @property
    def env_steps(self) -> int:
        """Joint-action reward evaluations in this tree (the ``env_step`` increment)."""
        return sum(level.num_joint_actions for level in self.levels)


def collect_tree(
    env: GroupStepEnv,
    agents: Sequence[Policy],
    items: Sequence[tuple[Mapping[str, Any], int | None]],
    *,
    num_generations: int,
    sampling: SamplingConfig | Sequence[SamplingConfig],
    joint_mode: str = "aligned",
    backend: GenerationBackend | None = None,
    sample_key: int | None = None,
) -> RolloutTree:
    """Roll out ``items`` (``(item, index)`` pairs) through every turn of ``env`` with
    ``num_generations`` per branch, through its public group step only.

    ``sampling`` is one setting for every agent or one per agent; ``backend`` answers each
    level's requests (default :class:`~cmlrl_agents.policies.generation.HFGenerate`: one
    ``generate`` call per agent, or one for all adapter agents of a shared base with equal
    settings). ``sample_key`` (a :func:`~cmlrl_agents.policies.sampling.row_key`) keys every
    generated row by the item's index, its turn, its branch among the item's branches, the
    agent and the sample, so a row draws the same tokens whatever batch or rank it is generated
    in; None draws from torch's global generator."""
    states = [env.initial_state(item, index) for item, index in items]
    num_agents = len(states[0].prompts) if states else len(agents)
    if len(agents) != num_agents:
        raise ValueError(f"{len(agents)} agents for a task of {num_agents} agents.")
    per_agent = [sampling] * len(agents) if isinstance(sampling, SamplingConfig) else sampling
    if len(per_agent) != len(agents):
        raise ValueError(f"{len(per_agent)} sampling settings for {len(agents)} agents.")
    backend = HFGenerate() if backend is None else backend
    tree = RolloutTree(list(items), num_agents, num_generations, env.num_turns)
    joints = joint_indices(num_agents, num_generations, joint_mode)
    slots, parents = list(range(len(items))), [-1] * len(items)
    for turn in range(1, env.num_turns + 1):
        if not states:
            break
        _check_encodable(states, turn)
        keys = _row_keys(sample_key, states, slots, turn, len(agents), num_generations)
        requests = [
            GenerationRequest(
                a,
                [s.prompts[a] for s in states],
                num_generations,
                per_agent[a],
                None if keys is None else keys[a],
            )
            for a in range(len(agents))
        ]
        completions = backend.generate(agents, requests)
        outcomes = _step_items(env, states, slots, completions, joints)
        tree.levels.append(Level(turn, states, slots, parents, completions, joints, outcomes))
        states, slots, parents = _children(outcomes, slots, len(joints))
    return tree


def _row_keys(
    sample_key: int | None,
    states: list[EpisodeState],
    slots: list[int],
    turn: int,
    num_agents: int,
    num_generations: int,
) -> list[list[int]] | None:
    """Per agent, one key per (branch, sample) of this level (branch-major), or None."""
    if sample_key is None:
        return None
    seen: dict[int, int] = {}
    branch_of_item = []
    for slot in slots:
        branch_of_item.append(seen.get(slot, 0))
        seen[slot] = seen.get(slot, 0) + 1
    out = []
    for a in range(num_agents):
        keys = []
        for state, slot, b in zip(states, slots, branch_of_item, strict=True):
            item = slot if state.item_index is None else state.item_index
            keys += [row_key(sample_key, item, turn, b, a, g) for g in range(num_generations)]
        out.append(keys)
    return out


def _check_encodable(states: list[EpisodeState], turn: int) -> None:
    """Refuse a prompt that has no UTF-8 form (a lone surrogate from a formatter or transition)
    before a tokenizer meets it with a bare ``UnicodeEncodeError``."""
    for state in states:
        for a, prompt in enumerate(state.prompts):
            try:
                prompt.encode("utf-8")
            except UnicodeEncodeError as exc:
                where = "item" if state.item_index is None else f"item {state.item_index}"
                raise ValueError(
                    f"the turn-{turn} prompt of agent_{a} for {where} holds "
                    f"{prompt[exc.start : exc.end]!r} at character {exc.start}, which no "
                    f"tokenizer can encode (a lone surrogate, not text): {prompt!r:.80}. Fix "
                    "the formatter or external_transition that built it, e.g. "
                    "text.encode('utf-8', 'replace').decode()."
                ) from None


def _step_items(
    env: GroupStepEnv,
    states: list[EpisodeState],
    slots: list[int],
    completions: list[list[list[Completion]]],
    joints: list[tuple[int, ...]],
) -> list[list[Outcome]]:
    """One ``step_group`` (one reward call) per task item over all of its branches."""
    outcomes: list[list[Outcome]] = [[] for _ in states]
    by_slot: dict[int, list[int]] = {}
    for branch, slot in enumerate(slots):
        by_slot.setdefault(slot, []).append(branch)
    for branches in by_slot.values():
        actions = [
            [tuple(completions[a][b][g].text for a, g in enumerate(joint)) for joint in joints]
            for b in branches
        ]
        result = env.step_group([states[b] for b in branches], actions)
        for b, row in zip(branches, result, strict=True):
            outcomes[b] = row
    return outcomes


def _children(
    outcomes: list[list[Outcome]], slots: list[int], num_joints: int
) -> tuple[list[EpisodeState], list[int], list[int]]:
    states, child_slots, parents = [], [], []
    for branch, row in enumerate(outcomes):
        for j, outcome in enumerate(row):
            if outcome.next_state is not None:
                states.append(outcome.next_state)
                child_slots.append(slots[branch])
                parents.append(branch * num_joints + j)
    return states, child_slots, parents
