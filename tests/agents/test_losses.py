"""Hand-worked checks of cmlrl_agents.functional.losses."""

from __future__ import annotations

import math

import pytest
import torch

from cmlrl_agents.algorithms.magrpo_config import LOSS_AGGREGATIONS
from cmlrl_agents.functional.losses import (
    AGGREGATIONS,
    kl_k3,
    masked_mean,
    masked_sum,
    policy_gradient_loss,
    value_loss,
)

F64 = torch.float64
NAN = float("nan")
LN2 = math.log(2.0)

# Two sequences: 3 real tokens, and 2 real tokens + 1 padding (9.0 there must never count).
LOGP = [[-1.0, -2.0, -3.0], [-0.5, -1.5, 9.0]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
ADV = torch.tensor([2.0, -1.0], dtype=F64)


def _logp(values: list[list[float]] = LOGP) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, requires_grad=True)


def _close(actual: torch.Tensor, expected, atol: float = 1e-12) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


def _loss_and_grad(logp: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    loss = policy_gradient_loss(logp, kwargs.pop("mask", MASK), kwargs.pop("adv", ADV), **kwargs)
    (grad,) = torch.autograd.grad(loss, logp)
    return loss.detach(), grad


# --------------------------------------------------------------------------- plain policy loss


def test_the_config_accepts_exactly_the_aggregations_the_loss_has() -> None:
    assert LOSS_AGGREGATIONS == AGGREGATIONS


def test_sequence_sum_hand() -> None:
    # sequence log-probs: -1-2-3 = -6 and -0.5-1.5 = -2
    # per sequence -A*sum: -2*(-6) = 12 and -(-1)*(-2) = -2; mean = 5
    # d/dlogp = -A_i / B: row 0 -> -1, row 1 -> +0.5, padding 0
    loss, grad = _loss_and_grad(_logp(), aggregation="sequence_sum")
    _close(loss, 5.0)
    _close(grad, [[-1.0, -1.0, -1.0], [0.5, 0.5, 0.0]])


def test_token_mean_hand() -> None:
    # per token -A*logp: row 0 -> 2, 4, 6 (sum 12); row 1 -> -0.5, -1.5 (sum -2)
    # (12 - 2) / 5 real tokens = 2; d/dlogp = -A_i / 5: row 0 -> -0.4, row 1 -> 0.2
    loss, grad = _loss_and_grad(_logp(), aggregation="token_mean")
    _close(loss, 2.0)
    _close(grad, [[-0.4, -0.4, -0.4], [0.2, 0.2, 0.0]])


def test_sequence_mean_hand() -> None:
    # per sequence -A * mean logp: row 0 -> -2 * (-6 / 3) = 4; row 1 -> 1 * (-2 / 2) = -1
    # mean over sequences = 1.5; d/dlogp = -A_i / (B * L_i): row 0 -> -2/6, row 1 -> 1/4
    loss, grad = _loss_and_grad(_logp(), aggregation="sequence_mean")
    _close(loss, 1.5)
    _close(grad, [[-1 / 3, -1 / 3, -1 / 3], [0.25, 0.25, 0.0]])


def test_sequence_mean_of_equal_lengths_is_sequence_sum_over_the_length() -> None:
    mask = torch.ones(2, 3)
    mean, mean_grad = _loss_and_grad(_logp(), mask=mask, aggregation="sequence_mean")
    total, total_grad = _loss_and_grad(_logp(), mask=mask, aggregation="sequence_sum")
    torch.testing.assert_close(mean, total / 3)
    torch.testing.assert_close(mean_grad, total_grad / 3)


@pytest.mark.parametrize("aggregation", ["sequence_sum", "token_mean", "sequence_mean"])
@pytest.mark.parametrize("clipped", [False, True])
def test_masked_tokens_have_no_effect(aggregation: str, clipped: bool) -> None:
    extra = (
        {"old_logprobs": torch.full((2, 3), -1.0, dtype=F64), "clip_range": 0.2} if clipped else {}
    )
    base = _loss_and_grad(_logp(), aggregation=aggregation, **extra)
    for pad in (-100.0, 0.0, NAN, float("-inf")):
        changed = _loss_and_grad(
            _logp([LOGP[0], [-0.5, -1.5, pad]]), aggregation=aggregation, **extra
        )
        torch.testing.assert_close(changed[0], base[0], rtol=0, atol=0)
        torch.testing.assert_close(changed[1], base[1], rtol=0, atol=0)


@pytest.mark.parametrize("aggregation", ["sequence_sum", "token_mean", "sequence_mean"])
@pytest.mark.parametrize("clip_range", [None, 0.2])
def test_batched_equals_weighted_sum_of_single_samples(
    aggregation: str, clip_range: float | None
) -> None:
    gen = torch.Generator().manual_seed(0)
    logp = (-torch.rand(3, 4, generator=gen, dtype=F64)).requires_grad_(True)
    old = (
        (logp.detach() + 0.3 * torch.randn(3, 4, generator=gen, dtype=F64)) if clip_range else None
    )
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv = torch.tensor([0.7, -1.3, 2.0], dtype=F64)
    batched = policy_gradient_loss(logp, mask, adv, aggregation, old, clip_range)

    # sequence_sum and sequence_mean: mean over sequences -> weight 1/B (a single sequence's
    # own mean is its sequence_mean); token_mean: weight n_i / sum(n).
    counts = mask.sum(dim=1).to(F64)
    weights = counts / counts.sum() if aggregation == "token_mean" else torch.full((3,), 1.0 / 3)
    singles = [
        policy_gradient_loss(
            logp[i : i + 1],
            mask[i : i + 1],
            adv[i : i + 1],
            aggregation,
            None if old is None else old[i : i + 1],
            clip_range,
        )
        for i in range(3)
    ]
    combined = sum(w * s for w, s in zip(weights, singles, strict=True))
    torch.testing.assert_close(batched, combined)
    (g_batched,) = torch.autograd.grad(batched, logp)
    (g_combined,) = torch.autograd.grad(combined, logp)
    torch.testing.assert_close(g_batched, g_combined)


# ------------------------------------------------------------------------- clipped surrogate


@pytest.mark.parametrize("aggregation", ["sequence_sum", "token_mean"])
def test_clipped_equals_plain_gradient_at_ratio_one(aggregation: str) -> None:
    # ratio = 1 everywhere: d(ratio*A)/dlogp = ratio*A = A, the plain gradient. The VALUES differ
    # (-A per token instead of -A*logp), so only gradients are compared.
    logp = _logp()
    _, plain_grad = _loss_and_grad(logp, aggregation=aggregation)
    loss, clip_grad = _loss_and_grad(
        logp, aggregation=aggregation, old_logprobs=logp.detach(), clip_range=0.2
    )
    torch.testing.assert_close(clip_grad, plain_grad)
    # value: sequence_sum = mean(-2*3, 1*2) = -2; token_mean = (-6 + 2) / 5 = -0.8
    _close(loss, -2.0 if aggregation == "sequence_sum" else -0.8)


# old = -1 everywhere; logp = -1 + log(ratio) with ratios [1.5, 0.5] in both rows; clip 0.2.
CLIP_LOGP = [[-1.0 + math.log(1.5), -1.0 + math.log(0.5)]] * 2
CLIP_OLD = torch.full((2, 2), -1.0, dtype=F64)
CLIP_MASK = torch.ones(2, 2)
# row 0, A = +2: r=1.5 -> min(3.0, 1.2*2=2.4) = 2.4 (clipped)  -> s = -2.4
#                r=0.5 -> min(1.0, 0.8*2=1.6) = 1.0            -> s = -1.0   (row sum -3.4)
# row 1, A = -1: r=1.5 -> min(-1.5, -1.2) = -1.5                -> s = +1.5
#                r=0.5 -> min(-0.5, -0.8) = -0.8 (clipped)      -> s = +0.8   (row sum 2.3)
# gradient of s = -r*A where unclipped, 0 where clipped:
#   row 0: [0, -0.5*2 = -1.0]; row 1: [-1.5*(-1) = 1.5, 0]


def test_clipped_sequence_sum_hand() -> None:
    loss, grad = _loss_and_grad(
        _logp(CLIP_LOGP),
        mask=CLIP_MASK,
        aggregation="sequence_sum",
        old_logprobs=CLIP_OLD,
        clip_range=0.2,
    )
    _close(loss, (-3.4 + 2.3) / 2)  # -0.55
    _close(grad, [[0.0, -0.5], [0.75, 0.0]])  # / B = 2


def test_clipped_token_mean_hand() -> None:
    loss, grad = _loss_and_grad(
        _logp(CLIP_LOGP),
        mask=CLIP_MASK,
        aggregation="token_mean",
        old_logprobs=CLIP_OLD,
        clip_range=0.2,
    )
    _close(loss, (-3.4 + 2.3) / 4)  # -0.275
    _close(grad, [[0.0, -0.25], [0.375, 0.0]])  # / 4 tokens


def test_clipping_stops_gradient_above_one_plus_eps_for_positive_advantage() -> None:
    adv = torch.tensor([1.0], dtype=F64)
    old = torch.zeros(1, 3, dtype=F64)
    # ratios 1.1 (inside), 1.3 and 2.0 (above 1 + 0.2)
    logp = torch.tensor(
        [[math.log(1.1), math.log(1.3), math.log(2.0)]], dtype=F64, requires_grad=True
    )
    loss, grad = _loss_and_grad(
        logp, mask=torch.ones(1, 3), adv=adv, old_logprobs=old, clip_range=0.2
    )
    _close(loss, -(1.1 + 1.2 + 1.2))
    _close(grad, [[-1.1, 0.0, 0.0]])


# ------------------------------------------------------------------------------ bad policy input


def test_policy_loss_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"logprobs contains NaN or inf at index \[0, 1\]"):
        policy_gradient_loss(_logp([[-1.0, NAN, -3.0], [-0.5, -1.5, 9.0]]), MASK, ADV)
    with pytest.raises(ValueError, match=r"advantages contains NaN"):
        policy_gradient_loss(_logp(), MASK, torch.tensor([NAN, 1.0], dtype=F64))
    with pytest.raises(ValueError, match=r"advantages must have shape \(2,\), got \(3,\)"):
        policy_gradient_loss(_logp(), MASK, torch.zeros(3, dtype=F64))
    with pytest.raises(
        ValueError, match=r"mask must have shape \(2, 3\) \(like logprobs\), got \(2, 2\)"
    ):
        policy_gradient_loss(_logp(), MASK[:, :2], ADV)
    with pytest.raises(ValueError, match=r"aggregation must be one of .*'token_sum'"):
        policy_gradient_loss(_logp(), MASK, ADV, aggregation="token_sum")
    with pytest.raises(
        ValueError, match=r"old_logprobs and clip_range go together.*clip_range=0.2"
    ):
        policy_gradient_loss(_logp(), MASK, ADV, clip_range=0.2)
    with pytest.raises(ValueError, match=r"mask has no real token"):
        policy_gradient_loss(_logp(), torch.zeros(2, 3), ADV)
    with pytest.raises(ValueError, match=r"logprobs must be 2-D, got shape \(3,\)"):
        policy_gradient_loss(torch.zeros(3), torch.ones(3), ADV)
    with pytest.raises(ValueError, match=r"clip_range must be > 0, got 0"):
        policy_gradient_loss(_logp(), MASK, ADV, old_logprobs=_logp().detach(), clip_range=0)


def test_ratio_overflow_raises_instead_of_returning_inf() -> None:
    # exp(100) overflows float32; with A < 0 the surrogate picks the infinite term.
    logp = torch.tensor([[0.0]], requires_grad=True)
    with pytest.raises(ValueError, match=r"policy loss \(ratio overflow"):
        policy_gradient_loss(
            logp,
            torch.ones(1, 1),
            torch.tensor([-1.0]),
            "sequence_sum",
            torch.tensor([[-100.0]]),
            0.2,
        )


# ------------------------------------------------------------------------------------ value_loss

V = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
T = torch.tensor([1.5, 2.0, 1.0], dtype=F64)


def test_value_loss_hand() -> None:
    # (v - t)^2 = [0.25, 0, 4]; mean = 4.25 / 3
    _close(value_loss(V, T), 4.25 / 3)


def test_value_loss_clipped_hand() -> None:
    # old = [0.5, 2.5, 2.5], c = 0.2: v - old = [0.5, -0.5, 0.5] -> clipped [0.2, -0.2, 0.2]
    # clipped v = [0.7, 2.3, 2.7]; (clipped v - t)^2 = [0.64, 0.09, 2.89]
    # max with [0.25, 0, 4] = [0.64, 0.09, 4]; mean = 4.73 / 3
    old = torch.tensor([0.5, 2.5, 2.5], dtype=F64)
    _close(value_loss(V, T, old, 0.2), 4.73 / 3)


def test_value_loss_gradient_flows_to_values_only() -> None:
    values = V.clone().requires_grad_(True)
    targets = T.clone().requires_grad_(True)
    value_loss(values, targets).backward()
    _close(values.grad, [2 * (1.0 - 1.5) / 3, 0.0, 2 * (3.0 - 1.0) / 3])
    assert targets.grad is None


def test_value_loss_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"targets must have shape \(3,\), got \(2,\)"):
        value_loss(V, T[:2])
    with pytest.raises(ValueError, match=r"old_values and clip_range go together"):
        value_loss(V, T, old_values=V)
    with pytest.raises(ValueError, match=r"values contains NaN"):
        value_loss(torch.tensor([NAN, 1.0, 2.0]), T.float())


# ----------------------------------------------------------------------------------------- kl_k3


def test_kl_k3_zero_when_equal() -> None:
    logp = torch.tensor(LOGP, dtype=F64)
    _close(kl_k3(logp, logp.clone(), MASK), [0.0, 0.0])


def test_kl_k3_hand() -> None:
    # d = ref - logp = +ln2: e^d - d - 1 = 2 - ln2 - 1 = 1 - ln2 = 0.3068528
    # d = -ln2:              e^d - d - 1 = 0.5 + ln2 - 1 = ln2 - 0.5 = 0.1931472
    # d = 0:                 0
    # row 0: [+ln2, -ln2, 0] -> 0.5;  row 1: [+ln2, 0, padding (NaN, ignored)] -> 1 - ln2
    logp = torch.full((2, 3), -1.0, dtype=F64)
    ref = torch.tensor([[-1.0 + LN2, -1.0 - LN2, -1.0], [-1.0 + LN2, -1.0, NAN]], dtype=F64)
    _close(kl_k3(logp, ref, MASK), [0.5, 1.0 - LN2])


def test_kl_k3_positive_when_different() -> None:
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(4, 5, generator=gen, dtype=F64)
    ref = logp + 0.1 * torch.randn(4, 5, generator=gen, dtype=F64)
    assert (kl_k3(logp, ref, torch.ones(4, 5)) > 0).all()


def test_kl_k3_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"ref_logprobs must have shape \(2, 3\), got \(2, 2\)"):
        kl_k3(torch.zeros(2, 3), torch.zeros(2, 2), MASK)


# ---------------------------------------------------------------------------------------- masked


def test_masked_sum_and_mean() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, NAN]], dtype=F64)
    _close(masked_sum(x, MASK), 15.0)
    _close(masked_sum(x, MASK, dim=1), [6.0, 9.0])
    _close(masked_mean(x, MASK), 3.0)
    _close(masked_mean(x, MASK, dim=1), [2.0, 4.5])
    with pytest.raises(ValueError, match=r"mask has no 1 in some slice reduced over dim=1"):
        masked_mean(x, torch.tensor([[1, 0, 0], [0, 0, 0]]), dim=1)
