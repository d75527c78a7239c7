"""A target token's log-prob at a temperature and its gradient: hand-worked numbers, and the
same bits as autograd's own chain (division, ``logsumexp``, ``gather``), which the one-buffer
backward replaced."""

from __future__ import annotations

import math

import pytest
import torch

from cmlrl_agents.policies.logprobs import _gather_logprobs, _last_positions


def test_hand_worked_log_prob_and_gradient_at_a_temperature() -> None:
    # Two tokens, logits [0, ln 3]. At T = 1: p = [1/4, 3/4]; at T = 1/2 the logits double:
    # p = [1/10, 9/10]. log p(token 1) and its gradient (onehot - p) / T.
    logits = torch.tensor([[[0.0, math.log(3.0)]]] * 2, requires_grad=True)
    temperature = torch.tensor([1.0, 0.5]).view(-1, 1, 1)
    scores = _gather_logprobs(logits, torch.tensor([[1], [1]]), None, temperature, entropy=True)
    torch.testing.assert_close(scores.logprobs, torch.tensor([[math.log(0.75)], [math.log(0.9)]]))
    entropy = [
        -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)),
        -(0.1 * math.log(0.1) + 0.9 * math.log(0.9)),
    ]
    assert scores.entropy is not None
    torch.testing.assert_close(scores.entropy, torch.tensor(entropy).view(2, 1))
    scores.logprobs.sum().backward()
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad, torch.tensor([[[-0.25, 0.25]], [[-0.2, 0.2]]]))


def _autograd_chain(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    part = logits if temperature is None else logits / temperature
    lse = part.logsumexp(dim=-1)
    with torch.no_grad():
        entropy = lse - (torch.softmax(part, dim=-1) * part).sum(dim=-1)
    return part.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, entropy


@pytest.mark.parametrize("temperature", [None, torch.tensor([0.7, 1.3, 0.9]).view(-1, 1, 1)])
@pytest.mark.parametrize("chunk", [None, 2])
def test_values_entropies_and_gradients_are_autograds_own_bit_for_bit(
    temperature: torch.Tensor | None, chunk: int | None
) -> None:
    generator = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(3, 5, 300, generator=generator)
    targets = torch.randint(0, 300, (3, 5), generator=generator)
    weights = torch.randn(3, 5, generator=generator)
    ours, theirs = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    scores = _gather_logprobs(ours, targets, chunk, temperature, entropy=True)
    logprobs, entropy = _autograd_chain(theirs, targets, temperature)
    (scores.logprobs * weights).sum().backward()
    (logprobs * weights).sum().backward()
    assert torch.equal(scores.logprobs, logprobs)
    assert scores.entropy is not None and torch.equal(scores.entropy, entropy)
    assert ours.grad is not None and theirs.grad is not None
    assert torch.equal(ours.grad, theirs.grad)


def test_logits_of_exactly_the_kept_positions_pass_through_unsliced() -> None:
    # A [:, -keep:] slice would back its gradient with a zero-filled copy of the whole logits.
    logits = torch.randn(2, 5, 7, requires_grad=True)
    assert _last_positions(logits, 5) is logits
    assert _last_positions(logits, 9) is logits  # fewer than asked: the caller's check raises
    kept = _last_positions(logits, 3)
    assert torch.equal(kept, logits[:, -3:])
    assert type(kept.grad_fn).__name__ == "SliceBackward0"


@pytest.mark.parametrize("prefix_sharing", [False, True])
def test_a_batch_without_completion_tokens_backpropagates_zeros(prefix_sharing: bool) -> None:
    from cmlrl_agents.policies.tokens import build_batch
    from cmlrl_agents.testing import tiny_agent

    agent = tiny_agent(seed=1)
    batch = build_batch([[5, 6, 7], [8, 9]], [[], []], agent.pad_token_id)
    scores = agent.score(batch, prefix_sharing=prefix_sharing)
    assert scores.shape == batch.input_ids.shape and not scores.any()
    scores.sum().backward()  # as autograd's own path would: zero gradients, no error
    weights = [p.grad for p in agent.model.parameters()]
    assert all(g is None or not g.any() for g in weights)
