"""Hand-worked checks of cmlrl_agents.functional.preference_losses (Bradley-Terry and DPO)."""

from __future__ import annotations

import math

import pytest
import torch

from cmlrl_agents.functional.preference_losses import (
    bradley_terry_loss,
    dpo_implicit_rewards,
    dpo_loss,
    dpo_margin_stats,
    joint_log_ratio,
    pair_accuracy,
)

F64 = torch.float64
LN2 = math.log(2.0)


def t(values, grad: bool = False) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=grad)


def test_bradley_terry_loss_by_hand():
    # -log sigmoid(1) = log(1 + e^-1) = 0.313261687518...; -log sigmoid(0) = log 2.
    loss = bradley_terry_loss(t([1.0, 0.0]), t([0.0, 0.0]))
    assert float(loss) == pytest.approx((math.log1p(math.exp(-1.0)) + LN2) / 2, abs=1e-12)
    assert float(loss) == pytest.approx(0.503204434, abs=1e-9)


def test_bradley_terry_gradient_pushes_chosen_up_and_rejected_down():
    chosen, rejected = t([0.0], grad=True), t([0.0], grad=True)
    bradley_terry_loss(chosen, rejected).backward()
    # d/dc -log sigmoid(c - r) = -sigmoid(r - c) = -1/2 at c = r.
    assert float(chosen.grad) == pytest.approx(-0.5)
    assert float(rejected.grad) == pytest.approx(0.5)


def test_pair_accuracy_counts_ties_as_wrong():
    assert pair_accuracy(t([2.0, 1.0, 0.0, 3.0]), t([1.0, 1.0, 1.0, 0.0])) == 0.5
    with pytest.raises(ValueError, match="at least one pair"):
        pair_accuracy(t([]), t([]))


def test_joint_log_ratio_sums_the_agents():
    policy = t([[1.0, 2.0], [3.0, 4.0]])  # [agent, pair]
    reference = t([[0.0, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(joint_log_ratio(policy, reference), t([3.0, 4.0]))
    with pytest.raises(ValueError, match=r"\[num_agents, num_pairs\]"):
        joint_log_ratio(t([1.0]), t([1.0]))


def test_dpo_loss_by_hand():
    # beta * (2 - (-1)) = 0.5 * 3 = 1.5; -log sigmoid(1.5) = log(1 + e^-1.5) = 0.201413...
    loss = dpo_loss(t([2.0]), t([-1.0]), beta=0.5)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-12)
    assert float(loss) == pytest.approx(0.2014132779, abs=1e-9)


def test_dpo_at_the_reference_is_log2_with_the_plain_half_beta_push():
    # pi == pi_ref: both log-ratios are 0, the margin is 0 and the loss is log 2. The gradient
    # with respect to the log-ratios is -beta/2 (chosen) and +beta/2 (rejected): DPO starts as
    # a plain preference push, scaled by beta.
    chosen, rejected = t([0.0], grad=True), t([0.0], grad=True)
    loss = dpo_loss(chosen, rejected, beta=0.1)
    assert float(loss.detach()) == pytest.approx(LN2, abs=1e-12)
    loss.sum().backward()
    assert float(chosen.grad) == pytest.approx(-0.05, abs=1e-12)
    assert float(rejected.grad) == pytest.approx(0.05, abs=1e-12)


def test_dpo_has_zero_gradient_when_chosen_and_rejected_are_the_same_response():
    # The same response on both sides: the margin is 0 whatever the policy, so the gradient
    # through the shared log-ratio cancels exactly.
    shared = t([0.7], grad=True)
    dpo_loss(shared, shared, beta=0.1).sum().backward()
    assert float(shared.grad) == 0.0


def test_dpo_loss_falls_and_its_gradient_shrinks_as_the_margin_rises():
    margins = [-2.0, -0.5, 0.0, 0.5, 2.0, 8.0]
    losses, grads = [], []
    for m in margins:
        chosen = t([m], grad=True)
        loss = dpo_loss(chosen, t([0.0]), beta=1.0)
        loss.sum().backward()
        losses.append(float(loss.detach()))
        grads.append(abs(float(chosen.grad)))
    assert losses == sorted(losses, reverse=True) and len(set(losses)) == len(losses)
    assert grads == sorted(grads, reverse=True)
    # -d/dm -log sigmoid(m) = sigmoid(-m): at m = 2 it is 0.1192029...
    assert grads[4] == pytest.approx(1 / (1 + math.exp(2.0)), abs=1e-12)


def test_dpo_implicit_rewards_and_stats():
    torch.testing.assert_close(dpo_implicit_rewards(t([2.0, -1.0]), 0.1), t([0.2, -0.1]))
    stats = dpo_margin_stats(t([2.0, -1.0]), t([0.0, 1.0]), beta=0.5)
    assert stats == pytest.approx(
        {"accuracy": 0.5, "margin": 0.0, "chosen_reward": 0.25, "rejected_reward": 0.25}
    )


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="chosen_scores has shape"):
        bradley_terry_loss(t([1.0, 2.0]), t([1.0]))
    with pytest.raises(ValueError, match="beta must be > 0"):
        dpo_loss(t([1.0]), t([0.0]), beta=0.0)
