"""MAGRPO tree bookkeeping with scripted policies: returns, credit and advantages by hand."""

from __future__ import annotations

import pytest
import torch
from datasets import Dataset

from cmlrl_agents.algorithms.magrpo_config import (
    MAGRPOConfig,
    MAREINFORCEConfig,
    MAReMaxConfig,
    MARLOOConfig,
)
from cmlrl_agents.foundation.rollout import collect_tree, joint_indices
from cmlrl_agents.learning.credit import (
    advantage_scale,
    agent_returns,
    agent_rows,
    batch_stds,
    joint_returns,
    return_moments,
    sibling_advantages,
)
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.scripted import ScriptedPolicy
from cmlrl_env import Task

SAMPLING = SamplingConfig(max_new_tokens=4)


def path_policy() -> ScriptedPolicy:
    """Sample g answers ``g`` at the root and ``<prompt>/g`` below it: texts name their branch."""
    return ScriptedPolicy(lambda prompt, g: str(g) if prompt == "root" else f"{prompt}/{g}")


def next_prompt_is_answer(prompt, agent_completions, num_agents, **history):
    return [agent_completions[0]] * num_agents


def table_reward(table, calls):
    def reward(c1, c2):
        calls.append((list(c1), list(c2)))
        return [table[a] for a in c1]

    return reward


ITEM = ({"prompt": "root"}, 0)


def test_two_turn_aligned_tree_returns_by_hand():
    # Turn 1: joint actions "0" (r=0.5) and "1" (r=0.1); each is expanded into 2 children.
    table = {"0": 0.5, "1": 0.1, "0/0": 1.0, "0/1": 0.4, "1/0": 0.2, "1/1": 0.0}
    calls: list = []
    task = Task(
        None,
        table_reward(table, calls),
        num_agents=2,
        num_turns=2,
        external_transition=next_prompt_is_answer,
        early_termination_threshold=None,
    )
    agents = [path_policy(), path_policy()]
    tree = collect_tree(task, agents, [ITEM], num_generations=2, sampling=SAMPLING)

    assert [level.turn for level in tree.levels] == [1, 2]
    assert tree.env_steps == 6
    assert len(calls) == 2  # one reward call per item per turn, covering every branch
    assert calls[1] == (["0/0", "0/1", "1/0", "1/1"], ["0/0", "0/1", "1/0", "1/1"])
    assert [len(a.calls) for a in agents] == [2, 2]  # one generate per agent per turn
    assert agents[0].calls[1] == (["0", "1"], 2)
    # R(turn 2) = r; R(turn 1) = r + discount * mean(children):
    # discount 1: 0.5 + (1.0 + 0.4)/2 = 1.2 and 0.1 + (0.2 + 0.0)/2 = 0.2
    level1, level2 = joint_returns(tree, 1.0)
    torch.testing.assert_close(level1, torch.tensor([[1.2, 0.2]]))
    torch.testing.assert_close(level2, torch.tensor([[1.0, 0.4], [0.2, 0.0]]))
    # discount 0.5: 0.5 + 0.5 * 0.7 = 0.85 and 0.1 + 0.5 * 0.1 = 0.15
    torch.testing.assert_close(joint_returns(tree, 0.5)[0], torch.tensor([[0.85, 0.15]]))

    # GRPO advantages: (R - mean) / (std + 1e-6) within each sibling group.
    samples = agent_rows(tree, 0, agent_returns(tree, joint_returns(tree, 1.0)), "mean", "group")
    got = [round(s.advantage, 4) for s in samples]
    assert got == [1.0, -1.0, 1.0, -1.0, 1.0, -1.0]
    assert [s.turn for s in samples] == [1, 1, 2, 2, 2, 2]


def test_three_turn_tree_with_early_termination_by_hand():
    # threshold 0.9 ends "0" (1.0) after turn 1 and "1/1" (0.95) after turn 2.
    table = {"0": 1.0, "1": 0.3, "1/0": 0.5, "1/1": 0.95, "1/0/0": 0.2, "1/0/1": 0.4}
    task = Task(
        None,
        table_reward(table, []),
        num_agents=2,
        num_turns=3,
        external_transition=next_prompt_is_answer,
        early_termination_threshold=0.9,
    )
    tree = collect_tree(
        task, [path_policy(), path_policy()], [ITEM], num_generations=2, sampling=SAMPLING
    )
    assert [len(level.states) for level in tree.levels] == [1, 1, 1]
    assert tree.env_steps == 6
    outcomes = tree.levels[0].outcomes[0]
    assert [o.terminated for o in outcomes] == [True, False]
    # An ended branch keeps its reward for each unplayed turn: "0" 1.0 * 3, "1/1" 0.95 * 2.
    # discount 1: turn 2 "1/0": 0.5 + (0.2 + 0.4)/2 = 0.8; turn 1 "1": 0.3 + (0.8 + 1.9)/2
    r1, r2, r3 = joint_returns(tree, 1.0)
    torch.testing.assert_close(r3, torch.tensor([[0.2, 0.4]]))
    torch.testing.assert_close(r2, torch.tensor([[0.8, 1.9]]))
    torch.testing.assert_close(r1, torch.tensor([[3.0, 1.65]]))
    # discount 0.5: "1/1": 0.95 * 1.5 = 1.425; "1/0": 0.5 + 0.5 * 0.3 = 0.65;
    # "1": 0.3 + 0.5 * (0.65 + 1.425)/2 = 0.81875; "0": 1.0 * (1 + 0.5 + 0.25) = 1.75
    r1, r2, _ = joint_returns(tree, 0.5)
    torch.testing.assert_close(r2, torch.tensor([[0.65, 1.425]]))
    torch.testing.assert_close(r1, torch.tensor([[1.75, 0.81875]]))


def test_cross_mode_credits_the_mean_over_joint_actions():
    table = {("0", "0"): 1.0, ("0", "1"): 0.0, ("1", "0"): 0.5, ("1", "1"): 0.3}
    calls = []

    def reward(c1, c2):
        calls.append(len(c1))
        return [table[(a, b)] for a, b in zip(c1, c2, strict=True)]

    task = Task(None, reward, num_agents=2)
    tree = collect_tree(
        task,
        [path_policy(), path_policy()],
        [ITEM],
        num_generations=2,
        sampling=SAMPLING,
        joint_mode="cross",
    )
    assert calls == [4] and tree.env_steps == 4
    assert tree.levels[0].joints == [(0, 0), (0, 1), (1, 0), (1, 1)]
    credit = agent_returns(tree, joint_returns(tree, 1.0))[0]
    # agent 0, sample 0 took part in (0,0) and (0,1): (1.0 + 0.0)/2; sample 1: (0.5 + 0.3)/2
    # agent 1, sample 0 took part in (0,0) and (1,0): (1.0 + 0.5)/2; sample 1: (0.0 + 0.3)/2
    torch.testing.assert_close(credit, torch.tensor([[[0.5, 0.4], [0.75, 0.15]]]))


def test_joint_indices():
    assert joint_indices(2, 3, "aligned") == [(0, 0), (1, 1), (2, 2)]
    assert joint_indices(1, 2, "cross") == [(0,), (1,)]
    assert len(joint_indices(3, 2, "cross")) == 8
    with pytest.raises(ValueError, match="joint_mode must be 'aligned' or 'cross', got 'x'"):
        joint_indices(2, 2, "x")


def test_one_turn_tree_equals_flat():
    """A 2-turn task whose every branch ends after turn 1 trains like 1 turn: each ended branch
    keeps its reward for the unplayed turn (returns are ``(1 + discount)`` times the rewards), so
    std-normalised advantages are exactly the flat ones."""
    table = {"0": 0.5, "1": 0.1, "2": 0.7}
    flat = Task(None, table_reward(table, []), num_agents=2)
    ended = Task(
        None,
        table_reward(table, []),
        num_agents=2,
        num_turns=2,
        external_transition=next_prompt_is_answer,
        early_termination_threshold=-1.0,
    )
    trees = [
        collect_tree(
            t, [path_policy(), path_policy()], [ITEM, ITEM], num_generations=3, sampling=SAMPLING
        )
        for t in (flat, ended)
    ]
    torch.testing.assert_close(joint_returns(trees[0], 0.9)[0], trees[0].levels[0].rewards)
    torch.testing.assert_close(joint_returns(trees[1], 0.9)[0], 1.9 * trees[1].levels[0].rewards)
    samples = [
        agent_rows(t, 1, agent_returns(t, joint_returns(t, 0.9)), "rloo", "group") for t in trees
    ]
    assert [s.item_slot for s in samples[0]] == [s.item_slot for s in samples[1]]
    torch.testing.assert_close(
        torch.tensor([s.advantage for s in samples[1]]),
        torch.tensor([s.advantage for s in samples[0]]),
    )


def test_reinforce_family_advantages_differ_on_the_same_rewards():
    table = {"0": 0.5, "1": 0.1, "2": 0.9, "3": 0.2}
    task = Task(None, table_reward(table, []), num_agents=2)
    tree = collect_tree(
        task, [path_policy(), path_policy()], [ITEM], num_generations=4, sampling=SAMPLING
    )
    returns = agent_returns(tree, joint_returns(tree, 1.0))
    advantages = {}
    for config in (MAGRPOConfig(), MAREINFORCEConfig(), MAReMaxConfig(), MARLOOConfig()):
        samples = agent_rows(
            tree, 0, returns, config.advantage_mode, advantage_scale(config.advantage_normalization)
        )
        advantages[type(config).__name__] = [round(s.advantage, 4) for s in samples]
    # R = [0.5, 0.1, 0.9, 0.2], mean 0.425, max 0.9, std_pop 0.3112
    assert advantages["MAREINFORCEConfig"] == [0.5, 0.1, 0.9, 0.2]
    assert advantages["MAReMaxConfig"] == [-0.4, -0.8, 0.0, -0.7]
    # rloo: (4R - 1.7)/3
    assert advantages["MARLOOConfig"] == [0.1, -0.4333, 0.6333, -0.3]
    # (R - 0.425) / 0.311247 (std_pop = sqrt(0.3875 / 4)), not re-centred again
    assert advantages["MAGRPOConfig"] == [0.241, -1.0442, 1.5261, -0.7229]
    assert len({tuple(v) for v in advantages.values()}) == 4


def test_reward_sees_every_branch_of_one_item_with_batch_items():
    seen = []

    def reward(c1, c2, batch_items=None):  # the form the reference breaks (B4)
        seen.append(batch_items)
        return [1.0] * len(c1)

    task = Task(None, reward, num_agents=2)
    items = [({"prompt": "root", "id": i}, i) for i in range(3)]
    collect_tree(task, [path_policy(), path_policy()], items, num_generations=2, sampling=SAMPLING)
    assert [b[0]["id"] for b in seen] == [0, 1, 2]


def test_dataset_items_reach_the_tree_in_order():
    data = Dataset.from_dict({"prompt": ["root", "root"], "k": [7, 8]})
    task = Task(None, lambda a, b, *, batch_items: [batch_items[0]["k"]] * len(a), num_agents=2)
    items = [(dict(data[i]), i) for i in range(2)]
    tree = collect_tree(
        task, [path_policy(), path_policy()], items, num_generations=2, sampling=SAMPLING
    )
    torch.testing.assert_close(tree.levels[0].rewards, torch.tensor([[7.0, 7.0], [8.0, 8.0]]))


def test_batch_scaling_divides_each_turn_by_the_rounds_std():
    # credit [branches, N, G]: turn 1 has two branches, agent 0's returns [1, 3] and [2, 6]
    # (group stds 1 and 2; the round's std of 1, 3, 2, 6 is sqrt(3.5)); agent 1 gets the
    # returns doubled. Turn 2 has one branch [4, 4] (std 0).
    turn1 = torch.tensor([[[1.0, 3.0], [2.0, 6.0]], [[2.0, 6.0], [4.0, 12.0]]])
    turn2 = torch.tensor([[[4.0, 4.0], [8.0, 8.0]]])
    credit = [turn1, turn2]
    moments = return_moments(credit, num_agents=2, num_turns=3)
    assert moments == [4, 12, 50, 2, 8, 32, 0, 0, 0, 4, 24, 200, 2, 16, 128, 0, 0, 0]
    stds = batch_stds(moments, num_agents=2, num_turns=3)
    std = 3.5**0.5
    assert stds == [pytest.approx([std, 0.0, 0.0]), pytest.approx([2 * std, 0.0, 0.0])]
    batch = sibling_advantages(credit, 0, "mean", "batch", stds[0])
    torch.testing.assert_close(batch[0], torch.tensor([[-1 / std, 1 / std], [-2 / std, 2 / std]]))
    torch.testing.assert_close(batch[1], torch.zeros(1, 2))
    group = sibling_advantages(credit, 1, "mean", "group")
    torch.testing.assert_close(group[0], torch.tensor([[-1.0, 1.0], [-1.0, 1.0]]))
    none = sibling_advantages(credit, 1, "mean", "none")
    torch.testing.assert_close(none[0], torch.tensor([[-2.0, 2.0], [-4.0, 4.0]]))
    with pytest.raises(ValueError, match="'batch' divides by the round's std per turn"):
        sibling_advantages(credit, 0, "mean", "batch")
    with pytest.raises(ValueError, match="scale must be one of"):
        sibling_advantages(credit, 0, "mean", True)  # type: ignore[arg-type]
    assert [advantage_scale(v) for v in (True, False, "batch")] == ["group", "none", "batch"]
