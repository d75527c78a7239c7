"""Learning-signal defects of issue 9: early termination, precision, advantages, sampling."""

from __future__ import annotations

import random

import pytest
import torch

from cmlrl_agents.advantages import group_advantages
from cmlrl_agents.magrpo import agent_samples
from cmlrl_agents.magrpo_config import MAGRPOConfig, MAREINFORCEConfig
from cmlrl_agents.policy import SamplingConfig
from cmlrl_agents.returns import tree_returns
from cmlrl_agents.rollout import collect_tree
from cmlrl_agents.scripted import ScriptedPolicy
from cmlrl_env import Task

SAMPLING = SamplingConfig(max_new_tokens=4)


def _path_policy() -> ScriptedPolicy:
    return ScriptedPolicy(lambda prompt, g: str(g) if prompt == "root" else f"{prompt}/{g}")


def _answer_is_next_prompt(prompt, agent_completions, num_agents, **history):
    return [agent_completions[0]] * num_agents


# ------------------------------------------------------- 1. early termination and success
def test_an_answer_that_reaches_the_target_gets_the_largest_advantage():
    # The example: turn-1 rewards [1.0, 0.5, 0.2, 0.0], threshold 0.9; each missed
    # answer k is followed by turn-2 rewards 0.6, 0.7, 0.8, 0.9 (mean 0.75).
    table = {"0": 1.0, "1": 0.5, "2": 0.2, "3": 0.0}
    table.update({f"{k}/{g}": 0.6 + 0.1 * g for k in (1, 2, 3) for g in range(4)})
    task = Task(
        None,
        lambda c1, c2: [table[a] for a in c1],
        num_agents=2,
        num_turns=2,
        external_transition=_answer_is_next_prompt,
        early_termination_threshold=0.9,
    )
    tree = collect_tree(
        task,
        [_path_policy(), _path_policy()],
        [({"prompt": "root"}, 0)],
        num_generations=4,
        sampling=SAMPLING,
    )
    assert [o.terminated for o in tree.levels[0].outcomes[0]] == [True, False, False, False]
    turn1, _ = tree.returns(1.0)
    # Before the fix: [1.0, 1.25, 0.95, 0.75] (the 0.5 answer ranked first). Now the answer
    # that ended its branch keeps its reward for the turn it did not play: 1.0 + 1.0.
    torch.testing.assert_close(turn1, torch.tensor([[2.0, 1.25, 0.95, 0.75]]))
    samples = agent_samples(tree, 0, tree.agent_returns(tree.returns(1.0)), "mean", True)
    first = [s.advantage for s in samples if s.turn == 1]
    # R - mean(R) = [0.7625, 0.0125, -0.2875, -0.4875]; std_pop = sqrt(0.22546875)
    std = 0.22546875**0.5
    expected = [0.7625 / std, 0.0125 / std, -0.2875 / std, -0.4875 / std]
    assert first == pytest.approx(expected, abs=1e-5)
    assert first == sorted(first, reverse=True)  # credit follows the turn-1 reward


def test_success_is_never_credited_below_a_sibling_that_missed():
    # Property over random trees: with the sibling's later rewards no higher than the hit
    # answer's reward ("all else equal"), the hit answer's return is the larger one.
    rng = random.Random(0)
    for _ in range(200):
        turns, discount, threshold = rng.randint(2, 4), rng.choice([0.5, 0.9, 1.0]), 0.7
        hit = rng.uniform(threshold + 1e-3, 1.0)
        miss = rng.uniform(0.0, threshold)
        rewards, parents, left = [torch.tensor([hit, miss])], [torch.tensor([-1])], []
        left.append(torch.tensor([turns - 1, 0]))
        parent = 1  # the missed branch continues as one chain of 2 children per turn
        for _ in range(1, turns):
            later = [rng.uniform(0.0, hit), rng.uniform(0.0, hit)]
            rewards.append(torch.tensor(later))
            parents.append(torch.tensor([parent, parent]))
            left.append(torch.zeros(2, dtype=torch.long))
            parent = 0
        returns = tree_returns(rewards, parents, discount, left)
        assert float(returns[0][0]) >= float(returns[0][1])


def test_tree_returns_hold_an_ended_branch_reward_by_hand():
    # Level 0: [0.8 (ended, 2 turns left), 0.1]; level 1: two children of node 1, one ended
    # with 1 turn left (0.9); level 2: one child of level-1 node 0 (0.3).
    rewards = [torch.tensor([0.8, 0.1]), torch.tensor([0.2, 0.9]), torch.tensor([0.3])]
    parents = [torch.tensor([-1]), torch.tensor([1, 1]), torch.tensor([0])]
    left = [torch.tensor([2, 0]), torch.tensor([0, 1]), torch.tensor([0])]
    r0, r1, r2 = tree_returns(rewards, parents, 0.5, left)
    torch.testing.assert_close(r2, torch.tensor([0.3]))
    # 0.2 + 0.5 * 0.3 = 0.35; 0.9 * (1 + 0.5) = 1.35
    torch.testing.assert_close(r1, torch.tensor([0.35, 1.35]))
    # 0.8 * (1 + 0.5 + 0.25) = 1.4; 0.1 + 0.5 * (0.35 + 1.35) / 2 = 0.525
    torch.testing.assert_close(r0, torch.tensor([1.4, 0.525]))
    with pytest.raises(ValueError, match=r"turns_left\[0\] is > 0 for a joint action that has"):
        tree_returns(rewards, parents, 0.5, [torch.tensor([2, 1]), left[1], left[2]])
    with pytest.raises(ValueError, match=r"turns_left\[1\] must be a long tensor of shape"):
        tree_returns(rewards, parents, 0.5, [left[0], torch.tensor([0.0, 1.0]), left[2]])


# ------------------------------------------------------------- 3. no advantage blow-up
def test_raw_returns_are_never_divided_by_their_std():
    with pytest.raises(ValueError, match=r"advantage_mode='raw' with advantage_normalization=True"):
        MAGRPOConfig(advantage_mode="raw")
    config = MAGRPOConfig(advantage_normalization=False)
    with pytest.raises(ValueError, match="Set advantage_normalization=False"):
        MAGRPOConfig(advantage_mode="raw", advantage_normalization=True)
    config.advantage_mode = "raw"  # allowed once normalisation is off
    with pytest.raises(ValueError, match="advantage_normalization=True"):
        config.advantage_normalization = True
    assert config.advantage_normalization is False
    with pytest.raises(ValueError, match="baseline 'raw' with normalize_std=True"):
        group_advantages(torch.tensor([[0.7, 0.7]]), "raw", normalize_std=True)


def test_the_g1_hint_leads_to_a_working_config():
    with pytest.raises(ValueError) as info:
        MAGRPOConfig(num_generations=1)
    message = str(info.value)
    assert "advantage_mode='raw' with advantage_normalization=False" in message
    # Following the hint: plain REINFORCE; equal returns stay what they are.
    config = MAGRPOConfig(num_generations=1, advantage_mode="raw", advantage_normalization=False)
    adv = group_advantages(
        torch.tensor([[0.7], [0.7]]), config.advantage_mode, config.advantage_normalization
    )
    torch.testing.assert_close(adv, torch.tensor([[0.7], [0.7]]))
    assert MAREINFORCEConfig(num_generations=1).num_generations == 1
