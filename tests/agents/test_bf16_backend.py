"""``generation_backend="hf_bf16"``: sampling from bfloat16 copies of the agents, the sampler's
log-probs of its draws, the copies kept in step with training, and the loss's correction."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from datasets import Dataset

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.policies.backends import make_backend
from cmlrl_agents.policies.bf16_backend import BF16Generate
from cmlrl_agents.policies.generation import GenerationRequest
from cmlrl_agents.policies.sampling import CandidateSampler, SamplingConfig, Truncation
from cmlrl_agents.policies.scripted import ScriptedPolicy
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.testing import tiny_agent

SAMPLING = SamplingConfig(max_new_tokens=6, temperature=0.7, top_k=5, top_p=0.8)


def test_the_sampler_records_each_pick_under_the_truncated_distribution_it_drew_from() -> None:
    # probabilities 4/8, 2/8, 1/8, 1/8; top-k 3 keeps 4/7, 2/7, 1/7; top-p 0.7 keeps the tokens
    # whose more likely tokens hold < 0.7: the first two (0 and 4/7), renormalised to 2/3, 1/3.
    logits = torch.log(torch.tensor([[4.0, 2.0, 1.0, 1.0]] * 64))
    record: list[torch.Tensor] = []
    sampler = CandidateSampler(1.0, 3, 0.7, keys=torch.arange(64), record=record)
    picked = sampler(torch.zeros(64, 1, dtype=torch.long), logits).argmax(dim=-1)
    assert set(picked.tolist()) == {0, 1}
    expected = torch.where(picked == 0, math.log(2 / 3), math.log(1 / 3))
    assert len(record) == 1
    torch.testing.assert_close(record[0], expected.float())


def test_an_agent_reports_the_log_probs_its_own_truncated_scoring_gives_its_draws() -> None:
    agent = tiny_agent(seed=3)
    agent.reports_sampler_logprobs = True
    out = agent.generate(["a story", "a poem"], 3, SAMPLING, keys=list(range(6)))
    rows = [c for per_prompt in out for c in per_prompt]
    assert all(len(c.sampler_logprobs) == len(c.completion_ids) for c in rows)
    ids = [c.prompt_ids for c in rows], [c.completion_ids for c in rows]
    batch = build_batch(*ids, agent.pad_token_id)
    truncation = Truncation.of([(SAMPLING.top_k, SAMPLING.top_p)] * len(rows), agent.device)
    with torch.no_grad():
        scores = agent.score_tokens(batch, temperature=0.7, truncation=truncation)
    assert scores.truncated_logprobs is not None
    for i, c in enumerate(rows):
        own = scores.truncated_logprobs[i][batch.completion_mask[i].bool()]
        torch.testing.assert_close(torch.tensor(c.sampler_logprobs), own, atol=1e-5, rtol=0)
    plain = tiny_agent(seed=3).generate(["a story"], 1, SAMPLING, keys=[0])
    assert plain[0][0].sampler_logprobs is None  # reported only when asked


def test_the_backend_samples_from_a_bf16_copy_and_copies_the_trained_weights_at_sync() -> None:
    agent = tiny_agent(seed=4)
    backend = make_backend("hf_bf16")
    assert isinstance(backend, BF16Generate)
    request = GenerationRequest(agent=0, prompts=["a story"], num_samples=2, sampling=SAMPLING)
    [[samples]] = backend.generate([agent], [request])
    assert all(s.sampler_logprobs is not None for s in samples)
    [(model, low)] = backend._copies.values()
    assert model is agent.model and low is not agent.model
    assert {p.dtype for p in low.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in agent.model.parameters()} == {torch.float32}  # the trained ones
    with torch.no_grad():
        for p in agent.model.parameters():
            p.add_(0.5)
    expected = {n: p.to(torch.bfloat16) for n, p in agent.model.named_parameters()}
    assert any(not torch.equal(expected[n], p) for n, p in low.named_parameters())
    backend.sync([agent])
    for name, param in low.named_parameters():
        assert torch.equal(param, expected[name]), name
    [[again]] = backend.generate([agent], [request])
    assert backend._copies[id(agent.model)][1] is low  # one copy per model, kept


def test_the_backend_refuses_an_agent_without_weights() -> None:
    refused = r"agents\[0\] is a ScriptedPolicy; use generation_backend='hf'"
    with pytest.raises(TypeError, match=refused):
        BF16Generate().generate(
            [ScriptedPolicy(lambda prompt, sample: "x")],
            [GenerationRequest(agent=0, prompts=["p"], num_samples=1, sampling=SAMPLING)],
        )


def test_a_team_trained_from_bf16_copies_changes_its_float32_weights_and_logs_the_weights(
    tmp_path,
) -> None:
    data = Dataset.from_dict({"prompt": ["a story", "a poem"]})
    args = MAGRPOConfig(
        num_agents=2,
        num_generations=2,
        max_new_tokens=6,
        agent_learning_rate=1e-3,
        generation_backend="hf_bf16",
        logging_steps=1,
        eval_interval=0,
        output_dir=str(tmp_path / "run"),
    )
    agents = [tiny_agent(seed=0), tiny_agent(seed=1)]
    before = [copy.deepcopy(a.model.state_dict()) for a in agents]
    trainer = MAGRPOTrainer(
        agents=agents,
        formatters=[lambda item: item["prompt"]] * 2,
        reward_func=lambda a, b: [float(len(x) < len(y)) for x, y in zip(a, b, strict=True)],
        train_dataset=data,
        args=args,
    )
    trainer.train()
    for agent, weights in zip(agents, before, strict=True):
        assert all(p.dtype == torch.float32 for p in agent.model.parameters())
        changed = [not torch.equal(weights[n], p) for n, p in agent.model.named_parameters()]
        assert any(changed)
        _, low = trainer.generation_backend._copies[id(agent.model)]  # synced after the update
        for (name, param), (_, served) in zip(
            agent.model.named_parameters(), low.named_parameters(), strict=True
        ):
            assert torch.equal(served, param.to(torch.bfloat16)), name
    entries = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    logged = [e for e in entries if "loss" in e][-1]
    assert math.isfinite(logged["loss"])
    # The copies draw what the float32 policy would, to bfloat16's rounding: weights near 1.
    for a in range(2):
        assert 0.5 < logged[f"agent_{a}/is_weight_mean"] < 1.5
