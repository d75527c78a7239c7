"""Hand-worked checks of cmlrl_agents.functional.returns; stable-baselines3 is the GAE oracle."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from cmlrl_agents.functional.returns import cross_credit, discounted_returns, gae, tree_returns

F64 = torch.float64
NAN = float("nan")


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def _idx(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def _close(actual: torch.Tensor, expected: list, atol: float = 1e-12) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


# ---------------------------------------------------------------------------------- tree_returns

# 2 turns: two root joint actions, each with two children.
#   level 0 r = [0.5, 0.2]
#   level 1 r = [1.2, 0.85 | 0.3, 0.1], parents [0, 0, 1, 1]  (leaves: R1 = r1)
TWO_TURN = ([_t([0.5, 0.2]), _t([1.2, 0.85, 0.3, 0.1])], [_idx([]), _idx([0, 0, 1, 1])])


def test_two_turn_tree_discount_one() -> None:
    # R0[0] = 0.5 + mean(1.2, 0.85) = 0.5 + 1.025 = 1.525 (the reference's verified number)
    # R0[1] = 0.2 + mean(0.3, 0.1)  = 0.2 + 0.2   = 0.4
    r0, r1 = tree_returns(*TWO_TURN, discount=1.0)
    _close(r0, [1.525, 0.4])
    _close(r1, [1.2, 0.85, 0.3, 0.1])


def test_two_turn_tree_discount_half() -> None:
    # R0[0] = 0.5 + 0.5 * 1.025 = 1.0125;  R0[1] = 0.2 + 0.5 * 0.2 = 0.3
    r0, _ = tree_returns(*TWO_TURN, discount=0.5)
    _close(r0, [1.0125, 0.3])


def test_childless_node_keeps_its_reward() -> None:
    # Root 1 terminated early (no children): R0 = [0.5 + 1.025, 0.9]
    r0, _ = tree_returns([_t([0.5, 0.9]), _t([1.2, 0.85])], [_idx([]), _idx([0, 0])], 1.0)
    _close(r0, [1.525, 0.9])


# 3 turns, uneven branching:
#   level 0 r = [1.0, 0.0]
#   level 1 r = [0.5, 0.25, 2.0, 0.7], parents [0, 0, 1, 1]
#   level 2 r = [1.0, 3.0, 0.5, 4.0],  parents [0, 0, 1, 2]   (level-1 node 3 has no child)
THREE_TURN = (
    [_t([1.0, 0.0]), _t([0.5, 0.25, 2.0, 0.7]), _t([1.0, 3.0, 0.5, 4.0])],
    [_idx([]), _idx([0, 0, 1, 1]), _idx([0, 0, 1, 2])],
)


def test_three_turn_tree_discount_one() -> None:
    # R1 = [0.5 + mean(1, 3), 0.25 + 0.5, 2.0 + 4.0, 0.7] = [2.5, 0.75, 6.0, 0.7]
    # R0 = [1.0 + mean(2.5, 0.75), 0.0 + mean(6.0, 0.7)] = [2.625, 3.35]
    r0, r1, r2 = tree_returns(*THREE_TURN, discount=1.0)
    _close(r2, [1.0, 3.0, 0.5, 4.0])
    _close(r1, [2.5, 0.75, 6.0, 0.7])
    _close(r0, [2.625, 3.35])


def test_three_turn_tree_discount_half() -> None:
    # R1 = [0.5 + 0.5*2, 0.25 + 0.5*0.5, 2.0 + 0.5*4, 0.7] = [1.5, 0.5, 4.0, 0.7]
    # R0 = [1.0 + 0.5*mean(1.5, 0.5), 0.0 + 0.5*mean(4.0, 0.7)] = [1.5, 1.175]
    r0, r1, _ = tree_returns(*THREE_TURN, discount=0.5)
    _close(r1, [1.5, 0.5, 4.0, 0.7])
    _close(r0, [1.5, 1.175])


def test_one_level_is_flat() -> None:
    rewards = _t([0.3, -1.0, 2.5])
    (out,) = tree_returns([rewards], [_idx([])], discount=0.9)
    assert torch.equal(out, rewards)
    assert out is not rewards  # a copy: callers may edit it in place


def test_tree_bad_inputs() -> None:
    rewards, parents = TWO_TURN
    with pytest.raises(
        ValueError, match=r"parents\[1\] must index level 0 \(0\.\.1\), got values 0\.\.2"
    ):
        tree_returns(rewards, [_idx([]), _idx([0, 0, 1, 2])], 1.0)
    with pytest.raises(ValueError, match=r"parents\[1\] must be a long tensor of shape \(4,\)"):
        tree_returns(rewards, [_idx([]), torch.tensor([0.0, 0.0, 1.0, 1.0])], 1.0)
    with pytest.raises(
        ValueError, match=r"parents must have one entry per level like rewards \(2\), got 1"
    ):
        tree_returns(rewards, parents[1:], 1.0)
    with pytest.raises(ValueError, match=r"discount must be in \[0, 1\], got 1.5"):
        tree_returns(rewards, parents, 1.5)
    with pytest.raises(ValueError, match=r"rewards\[1\] contains NaN"):
        tree_returns([rewards[0], _t([1.0, NAN, 0.0, 0.0])], parents, 1.0)
    with pytest.raises(ValueError, match=r"rewards\[0\] must be 1-D, got shape \(1, 2\)"):
        tree_returns([rewards[0][None]], [_idx([])], 1.0)


# ---------------------------------------------------------------------------------- cross_credit


def test_cross_credit_two_agents_two_samples() -> None:
    # Joint order (a0, a1): (0,0)=1, (0,1)=2, (1,0)=3, (1,1)=6.
    # agent 0: c0 in (0,0),(0,1) -> mean(1, 2) = 1.5;  c1 in (1,0),(1,1) -> mean(3, 6) = 4.5
    # agent 1: c0 in (0,0),(1,0) -> mean(1, 3) = 2.0;  c1 in (0,1),(1,1) -> mean(2, 6) = 4.0
    out = cross_credit(_t([1.0, 2.0, 3.0, 6.0]), num_agents=2, group_size=2)
    _close(out, [[1.5, 4.5], [2.0, 4.0]])


def test_cross_credit_one_agent_is_identity() -> None:
    returns = _t([[0.1, 0.7, -2.0], [3.0, 4.0, 5.0]])
    out = cross_credit(returns, num_agents=1, group_size=3)
    assert out.shape == (2, 1, 3)
    assert torch.equal(out[:, 0], returns)


@pytest.mark.parametrize(("num_agents", "group_size"), [(2, 3), (3, 2), (3, 3)])
def test_cross_credit_matches_itertools_product(num_agents: int, group_size: int) -> None:
    gen = torch.Generator().manual_seed(0)
    returns = torch.randn(2, 5, group_size**num_agents, generator=gen, dtype=F64)
    out = cross_credit(returns, num_agents, group_size)
    assert out.shape == (2, 5, num_agents, group_size)
    joint = list(itertools.product(range(group_size), repeat=num_agents))
    for a in range(num_agents):
        for i in range(group_size):
            ks = [k for k, combo in enumerate(joint) if combo[a] == i]
            torch.testing.assert_close(out[..., a, i], returns[..., ks].mean(dim=-1))


def test_cross_credit_bad_inputs() -> None:
    with pytest.raises(
        ValueError, match=r"joint_returns must have last dim G\*\*N = 2\*\*2 = 4, got shape \(3,\)"
    ):
        cross_credit(_t([1.0, 2.0, 3.0]), num_agents=2, group_size=2)
    with pytest.raises(ValueError, match=r"num_agents must be an int >= 1, got 0"):
        cross_credit(_t([1.0]), num_agents=0, group_size=1)


# ---------------------------------------------------------------------------- discounted_returns

# Two chains: 3 steps, and 2 steps then padding (NaN in the padding must be ignored).
REWARDS = _t([[1.0, 2.0, 3.0], [4.0, 5.0, NAN]])
VALUES = _t([[0.5, 1.0, 2.0], [1.0, 2.0, NAN]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_discounted_returns_hand() -> None:
    # discount 0.5. row 0: G2 = 3, G1 = 2 + 0.5*3 = 3.5, G0 = 1 + 0.5*3.5 = 2.75
    #               row 1: G1 = 5, G0 = 4 + 0.5*5 = 6.5, padding 0
    _close(discounted_returns(REWARDS, MASK, 0.5), [[2.75, 3.5, 3.0], [6.5, 5.0, 0.0]])
    # discount 1: plain reward-to-go
    _close(discounted_returns(REWARDS, MASK.bool(), 1.0), [[6.0, 5.0, 3.0], [9.0, 5.0, 0.0]])


def test_discounted_returns_bad_mask() -> None:
    with pytest.raises(ValueError, match=r"mask row 0 is not a prefix"):
        discounted_returns(REWARDS, torch.tensor([[1, 0, 1], [1, 1, 0]]), 0.5)
    with pytest.raises(
        ValueError, match=r"mask must have the shape of rewards \(2, 3\), got \(2, 2\)"
    ):
        discounted_returns(REWARDS, MASK[:, :2], 0.5)
    with pytest.raises(ValueError, match=r"rewards contains NaN or inf at index \[1, 2\]"):
        discounted_returns(REWARDS, torch.ones(2, 3), 0.5)


# ------------------------------------------------------------------------------------------- gae


def test_gae_td0_hand() -> None:
    # lam = 0, discount 0.5: A_t = r_t + 0.5 * V_{t+1} - V_t, V = 0 after the last step.
    # row 0: 1 + 0.5*1 - 0.5 = 1.0;  2 + 0.5*2 - 1 = 2.0;  3 + 0 - 2 = 1.0
    # row 1: 4 + 0.5*2 - 1   = 4.0;  5 + 0 - 2     = 3.0;  padding 0
    # returns = A + V = r_t + 0.5 * V_{t+1}: [1.5, 3.0, 3.0], [5.0, 5.0, 0]
    adv, ret = gae(REWARDS, VALUES, MASK, discount=0.5, lam=0.0)
    _close(adv, [[1.0, 2.0, 1.0], [4.0, 3.0, 0.0]])
    _close(ret, [[1.5, 3.0, 3.0], [5.0, 5.0, 0.0]])


def test_gae_lambda_one_is_monte_carlo_hand() -> None:
    # lam = 1: returns = discounted returns [2.75, 3.5, 3], [6.5, 5, 0]; A = G - V
    adv, ret = gae(REWARDS, VALUES, MASK, discount=0.5, lam=1.0)
    _close(ret, [[2.75, 3.5, 3.0], [6.5, 5.0, 0.0]])
    _close(adv, [[2.25, 2.5, 1.0], [5.5, 3.0, 0.0]])
    torch.testing.assert_close(ret, discounted_returns(REWARDS, MASK, 0.5))


def test_gae_lambda_half_hand() -> None:
    # deltas row 0 = [1, 2, 1] (TD(0) above); discount*lam = 0.25
    # A2 = 1;  A1 = 2 + 0.25*1 = 2.25;  A0 = 1 + 0.25*2.25 = 1.5625
    # row 1 deltas [4, 3]: A1 = 3, A0 = 4 + 0.25*3 = 4.75
    adv, _ = gae(REWARDS, VALUES, MASK, discount=0.5, lam=0.5)
    _close(adv, [[1.5625, 2.25, 1.0], [4.75, 3.0, 0.0]])


def test_gae_output_is_detached() -> None:
    values = VALUES.clone().requires_grad_(True)
    adv, ret = gae(REWARDS, values, MASK, 0.9, 0.95)
    assert not adv.requires_grad and not ret.requires_grad


def _sb3_gae(rewards: np.ndarray, values: np.ndarray, lengths: list[int], gamma: float, lam: float):
    """Oracle: stable-baselines3's RolloutBuffer with one env per chain.

    Env b runs chain b for lengths[b] steps, then a new (dummy) episode starts, which cuts the
    bootstrap exactly like our terminal end. A chain that fills the buffer ends with done=True.
    """
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer

    batch, horizon = rewards.shape
    box = spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
    buf = RolloutBuffer(horizon, box, box, device="cpu", gae_lambda=lam, gamma=gamma, n_envs=batch)
    zeros = np.zeros((batch, 1), dtype=np.float32)
    for t in range(horizon):
        starts = np.array([t == 0 or t == n for n in lengths], dtype=np.float32)
        buf.add(
            zeros, zeros, rewards[:, t], starts, torch.as_tensor(values[:, t]), torch.zeros(batch)
        )
    dones = np.array([n == horizon for n in lengths])
    buf.compute_returns_and_advantage(torch.ones(batch), dones)
    return buf.advantages.T, buf.returns.T  # SB3 stores [T, n_envs]


@pytest.mark.parametrize(
    ("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.5), (0.0, 0.7)]
)
def test_gae_matches_stable_baselines3(gamma: float, lam: float) -> None:
    rng = np.random.default_rng(42)
    lengths = [5, 1, 3, 5, 2]
    batch, horizon = len(lengths), 5
    rewards = rng.normal(size=(batch, horizon)).astype(np.float32)
    values = rng.normal(size=(batch, horizon)).astype(np.float32)
    mask = torch.tensor([[t < n for t in range(horizon)] for n in lengths])

    adv, ret = gae(torch.from_numpy(rewards), torch.from_numpy(values), mask, gamma, lam)
    sb3_adv, sb3_ret = _sb3_gae(rewards, values, lengths, gamma, lam)
    m = mask.numpy()
    np.testing.assert_allclose(adv.numpy()[m], sb3_adv[m], atol=1e-5)
    np.testing.assert_allclose(ret.numpy()[m], sb3_ret[m], atol=1e-5)
    assert (adv.numpy()[~m] == 0).all() and (ret.numpy()[~m] == 0).all()


def test_gae_bad_inputs() -> None:
    with pytest.raises(
        ValueError, match=r"values must have the shape of rewards \(2, 3\), got \(2, 2\)"
    ):
        gae(REWARDS, VALUES[:, :2], MASK, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"lam must be in \[0, 1\], got -0.1"):
        gae(REWARDS, VALUES, MASK, 0.9, -0.1)
    with pytest.raises(ValueError, match=r"values contains NaN or inf at index \[0, 1\]"):
        gae(REWARDS, _t([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]]), MASK, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"mask must hold only 0 and 1"):
        gae(REWARDS, VALUES, torch.full((2, 3), 0.5), 0.9, 0.9)
