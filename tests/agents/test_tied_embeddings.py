"""A tied embedding's input-side gradient as the rows it touches: the same dense gradient for
the optimizer (up to float rounding), and nothing changed where the weight is not tied,
trainable and under gradient."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch

from cmlrl_agents.learning.optim import make_adamw
from cmlrl_agents.policies import agent as agent_module
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.tied_embeddings import sparse_tied_gradient
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.testing import tiny_agent


def _tied_agent() -> LLMAgent:
    agent = tiny_agent(seed=1)
    model = agent.model
    model.get_output_embeddings().weight = model.get_input_embeddings().weight
    return agent


def _weight_gradient(agent: LLMAgent, prefix_sharing: bool) -> torch.Tensor:
    # Two prompts, two completions each: the shared prompt pass and the completions' pass both
    # look the embedding up.
    prompts = [[5, 6, 7], [5, 6, 7], [9, 10], [9, 10]]
    completions = [[11, 12, 13], [14, 12], [15, 16, 17, 18], [19]]
    batch = build_batch(prompts, completions, agent.pad_token_id)
    agent.model.zero_grad(set_to_none=True)
    agent.score(batch, prefix_sharing=prefix_sharing, temperature=0.7).sum().backward()
    grad = agent.model.get_input_embeddings().weight.grad
    assert grad is not None
    return grad


@pytest.mark.parametrize("prefix_sharing", [True, False])
def test_a_tied_weight_gets_the_dense_gradient_it_got_with_dense_lookups(
    monkeypatch: pytest.MonkeyPatch, prefix_sharing: bool
) -> None:
    agent = _tied_agent()
    seen: list[bool] = []
    agent.model.get_input_embeddings().register_forward_pre_hook(
        lambda module, args: seen.append(module.sparse)
    )
    sparse = _weight_gradient(agent, prefix_sharing)
    assert seen == [True] * (2 if prefix_sharing else 1)  # each lookup of the scoring pass
    monkeypatch.setattr(agent_module, "sparse_tied_gradient", lambda model: nullcontext())
    dense = _weight_gradient(agent, prefix_sharing)
    assert seen[-1] is False
    assert sparse.layout == torch.strided and not sparse.is_sparse
    torch.testing.assert_close(sparse, dense, rtol=1e-5, atol=1e-6)
    assert sparse[[5, 6, 7, 9, 11]].abs().sum() > 0  # the lookups' rows are in it


def test_the_lookups_are_sparse_only_inside_the_block_and_an_optimizer_steps_on_the_result() -> (
    None
):
    agent = _tied_agent()
    embedding = agent.model.get_input_embeddings()
    with sparse_tied_gradient(agent.model):
        assert embedding.sparse
    assert not embedding.sparse
    with pytest.raises(RuntimeError, match="inside"), sparse_tied_gradient(agent.model):
        raise RuntimeError("inside")
    assert not embedding.sparse
    before = embedding.weight.detach().clone()
    _weight_gradient(agent, prefix_sharing=True)
    make_adamw(list(agent.model.parameters()), 1e-2, "agent_0").step()  # fused: no sparse
    assert not torch.equal(embedding.weight, before)


def test_untied_frozen_or_gradient_free_embeddings_are_left_alone() -> None:
    untied = tiny_agent(seed=1)
    frozen = _tied_agent()
    frozen.model.get_input_embeddings().weight.requires_grad_(False)
    for agent in (untied, frozen):
        with sparse_tied_gradient(agent.model):
            assert not agent.model.get_input_embeddings().sparse
    tied = _tied_agent()
    with torch.no_grad(), sparse_tied_gradient(tied.model):
        assert not tied.model.get_input_embeddings().sparse
    # The untied model's embedding gradient reaches its optimizer dense.
    assert not _weight_gradient(untied, prefix_sharing=True).is_sparse
