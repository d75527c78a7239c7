"""Keyed sampling: a generated row's draws depend on its key and its logits alone, so batching,
data parallel ranks and evaluation leave training's samples unchanged."""

from __future__ import annotations

import pytest
import torch

from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.sampling import CandidateSampler, keyed_uniforms, row_key
from cmlrl_agents.testing import tiny_agent
from cmlrl_env import CoMLRLEnv, tasks

SAMPLING = SamplingConfig(max_new_tokens=6, temperature=1.0, top_k=20, top_p=0.9)


def test_row_keys_are_distinct_and_uniforms_repeat_per_key_and_step() -> None:
    keys = {row_key(7, item, turn, g) for item in range(20) for turn in (1, 2) for g in range(4)}
    assert len(keys) == 160 and all(0 <= k < 2**63 for k in keys)
    assert row_key(7, 1, 2) != row_key(7, 2, 1)  # order matters
    k = torch.tensor(sorted(keys))
    u = keyed_uniforms(k, 3)
    assert torch.equal(u, keyed_uniforms(k, 3)) and not torch.equal(u, keyed_uniforms(k, 4))
    assert bool(((u >= 0) & (u < 1)).all())
    assert abs(keyed_uniforms(torch.arange(20000), 0).mean().item() - 0.5) < 0.01


def test_keyed_draws_follow_the_distribution() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(20000, 1)
    sampler = CandidateSampler(1.0, 4, 1.0, keys=torch.arange(20000) * 7919)
    picked = sampler(None, logits).argmax(-1)
    freq = torch.bincount(picked, minlength=4).float() / 20000
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.015, rtol=0)


def test_a_keyed_row_draws_the_same_tokens_in_any_batch() -> None:
    agent = tiny_agent(seed=2, eos_bias=2.0)
    keys = [row_key(1, p, g) for p in range(3) for g in range(2)]
    prompts = ["Describe a city.", "Invent a holiday.", "Name a fruit."]
    together = agent.generate(prompts, 2, SAMPLING, keys=keys)
    alone = agent.generate(prompts[1:2], 2, SAMPLING, keys=keys[2:4])
    assert [c.completion_ids for c in together[1]] == [c.completion_ids for c in alone[0]]
    assert together[0][0].completion_ids != together[0][1].completion_ids  # keys differ
    again = agent.generate(prompts, 2, SAMPLING, keys=keys)
    assert [[c.text for c in row] for row in again] == [[c.text for c in row] for row in together]


def test_a_rollout_keyed_by_the_run_samples_the_same_tree_in_any_grouping() -> None:
    agents = [tiny_agent(seed=0, eos_bias=2.0), tiny_agent(seed=1, eos_bias=2.0)]
    env = CoMLRLEnv(
        tasks.length_ratio_dataset().select(range(4)),
        [tasks.brief_formatter, tasks.detailed_formatter],
        tasks.length_ratio_reward,
    )
    items = [(env.spec.dataset[i], i) for i in range(4)]

    def texts(groups):
        out = []
        for group in groups:
            tree = collect_tree(
                env, agents, group, num_generations=2, sampling=SAMPLING, sample_key=11
            )
            out += [
                [c.text for c in row] for a in range(2) for row in tree.levels[0].completions[a]
            ]
        return sorted(map(tuple, out))

    assert texts([items]) == texts([items[:2], items[2:]]) == texts([items[3:], items[:3]])


def test_keys_must_match_the_rows() -> None:
    agent = tiny_agent()
    with pytest.raises(ValueError, match="3 sampling keys for 2 rows"):
        agent.generate(["a"], 2, SAMPLING, keys=[1, 2, 3])
