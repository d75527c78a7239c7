"""The candidate sampler: transformers' temperature / top-k / top-p distribution, drawn among
the top-k candidates only, and what ``generate`` makes of it."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.sampling import (
    CandidateSampler,
    Truncation,
    candidates,
    truncated_logprobs,
)
from cmlrl_agents.testing import tiny_agent


def _transformers_probs(logits, temperature, top_k, top_p):
    """The probabilities transformers' sampler draws from: its warpers in generate's order."""
    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k is not None:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return torch.softmax(scores, dim=-1)


def _dense(probs, ids, vocab):
    """Candidate probabilities spread back over the vocabulary, normalised as multinomial does."""
    probs = probs / probs.sum(-1, keepdim=True)
    if ids is None:
        return probs
    return torch.zeros(len(probs), vocab, dtype=probs.dtype).scatter(-1, ids, probs)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(0.6, 50, 0.6), (1.0, 5, 1.0), (0.7, None, 0.9), (1.3, 3, 0.5), (1.0, None, 1.0)],
)
def test_candidates_give_transformers_distribution(temperature, top_k, top_p) -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 300, dtype=torch.float64) * 3
    probs, ids = candidates(logits, temperature, top_k, top_p)
    expected = _transformers_probs(logits, temperature, top_k, top_p)
    torch.testing.assert_close(_dense(probs, ids, 300), expected, rtol=1e-12, atol=1e-12)


def test_top_p_keeps_the_smallest_set_reaching_top_p_and_at_least_one_token() -> None:
    # probabilities 0.5, 0.3, 0.15, 0.05 (most likely first)
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    probs, ids = candidates(logits, 1.0, 4, 0.7)
    assert ids.tolist() == [[0, 1, 2, 3]]
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.3, 0.0, 0.0]]))  # 0.5 < 0.7 <= 0.8
    probs, _ = candidates(logits, 1.0, 4, 0.1)  # multinomial normalises what is kept
    torch.testing.assert_close(probs, torch.tensor([[0.5, 0.0, 0.0, 0.0]]))


def test_the_sampler_leaves_one_finite_logit_drawn_from_the_distribution() -> None:
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log().repeat(20000, 1)
    sampler = CandidateSampler(temperature=1.0, top_k=3, top_p=1.0)
    torch.manual_seed(0)
    out = sampler(None, logits)
    assert torch.isfinite(out).sum(-1).eq(1).all() and out.max(-1).values.eq(0).all()
    picked = out.argmax(-1)
    freq = torch.bincount(picked, minlength=4).float() / len(picked)
    torch.testing.assert_close(freq, torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95, atol=0.015, rtol=0)
    torch.manual_seed(0)
    assert torch.equal(sampler(None, logits).argmax(-1), picked)  # the global seed repeats it


def test_generate_samples_with_it_repeatably_and_honours_min_new_tokens() -> None:
    agent = tiny_agent(seed=0)
    sampling = SamplingConfig(max_new_tokens=6, min_new_tokens=6, temperature=0.8, top_k=20)
    torch.manual_seed(3)
    first = agent.generate(["hello", "task 1"], 4, sampling)
    torch.manual_seed(3)
    again = agent.generate(["hello", "task 1"], 4, sampling)
    assert first == again
    rows = [c.completion_ids for row in first for c in row]
    assert all(len(ids) == 6 and not set(ids) & agent.eos_token_ids for ids in rows)
    assert len(set(rows)) > 1  # sampled, not greedy


def test_truncated_logprobs_cut_each_row_to_its_own_top_k_and_top_p() -> None:
    # probabilities 4/8, 2/8, 1/8, 1/8 at every position. Row 0: top-k 2 keeps 4/6 and 2/6;
    # row 1: no top-k, top-p 0.7 keeps the tokens whose more likely ones hold < 0.7 (the first
    # two): 2/3 and 1/3 again, and a token outside the set has log-prob -inf.
    scaled = torch.log(torch.tensor([4.0, 2.0, 1.0, 1.0])).expand(2, 2, 4)
    targets = torch.tensor([[0, 2], [1, 3]])
    truncation = Truncation.of([(2, 1.0), (None, 0.7)], torch.device("cpu"))
    got = truncated_logprobs(scaled, targets, truncation)
    inf = float("inf")
    expected = torch.tensor([[math.log(2 / 3), -inf], [math.log(1 / 3), -inf]])
    torch.testing.assert_close(got, expected)
