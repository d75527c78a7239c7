"""Hand-worked checks of cmlrl_agents.functional.advantages.

Running example: one group of G=4 returns R = [1, 2, 3, 6].
  mean(R) = 12/4 = 3, sum(R) = 12, max(R) = 6
  deviations [-2, -1, 0, 3]; squares 4 + 1 + 0 + 9 = 14; population var 14/4 = 3.5
  std_pop(R) = sqrt(3.5) = 1.8708287; 1/std = 0.5345225
"""

from __future__ import annotations

import math

import pytest
import torch

from cmlrl_agents.functional.advantages import group_advantages, normalize_batch, pooled_std

R = [1.0, 2.0, 3.0, 6.0]
STD = math.sqrt(3.5)


def _returns() -> torch.Tensor:
    return torch.tensor([R], dtype=torch.float64)


def _close(actual: torch.Tensor, expected: list[list[float]], atol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0
    )


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        ("mean", [-2.0, -1.0, 0.0, 3.0]),  # R - 3
        # (4R - 12) / 3: (4-12)/3, (8-12)/3, (12-12)/3, (24-12)/3
        ("rloo", [-8.0 / 3.0, -4.0 / 3.0, 0.0, 4.0]),
        ("max", [-5.0, -4.0, -3.0, 0.0]),  # R - 6
        ("raw", [1.0, 2.0, 3.0, 6.0]),
    ],
)
def test_baselines_without_std(baseline: str, expected: list[float]) -> None:
    _close(group_advantages(_returns(), baseline, normalize_std=False), [expected], atol=1e-12)


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        # [-2, -1, 0, 3] * 0.5345225
        ("mean", [-1.0690450, -0.5345225, 0.0, 1.6035675]),
        # [-8/3, -4/3, 0, 4] * 0.5345225
        ("rloo", [-1.4253933, -0.7126966, 0.0, 2.1380899]),
        # [-5, -4, -3, 0] * 0.5345225: NOT re-centred (the reference's bug B7 re-centred it)
        ("max", [-2.6726124, -2.1380899, -1.6035675, 0.0]),
    ],
)
def test_baselines_with_std(baseline: str, expected: list[float]) -> None:
    # The 7-digit hand values ignore eps, so use a negligible one here.
    out = group_advantages(_returns(), baseline, normalize_std=True, eps=1e-12)
    _close(out, [expected], atol=1e-7)
    # With the default eps it is exactly A / (std + 1e-6): scaled, never re-centred.
    default = group_advantages(_returns(), baseline, normalize_std=True)
    raw = group_advantages(_returns(), baseline, normalize_std=False)
    torch.testing.assert_close(default, raw / (STD + 1e-6), atol=1e-12, rtol=0)


def test_four_variants_differ_with_their_defaults() -> None:
    # MAGRPO: mean+std, MAREINFORCE: raw, MAReMax: max, MARLOO: rloo without std.
    variants = {
        "magrpo": group_advantages(_returns(), "mean", normalize_std=True),
        "mareinforce": group_advantages(_returns(), "raw", normalize_std=False),
        "maremax": group_advantages(_returns(), "max", normalize_std=False),
        "marloo": group_advantages(_returns(), "rloo", normalize_std=False),
    }
    names = list(variants)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(variants[a], variants[b]), (a, b)


def test_four_baselines_differ_even_all_with_std() -> None:
    # Regression for B7: with normalisation on for all four they must still differ.
    outs = [group_advantages(_returns(), b, normalize_std=True) for b in ("mean", "rloo", "max")]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not torch.allclose(outs[i], outs[j])


def test_rows_are_independent_groups() -> None:
    # Row 2 = [10, 10, 10, 14]: mean 11 -> [-1, -1, -1, 3]; it must not see row 1.
    returns = torch.tensor([R, [10.0, 10.0, 10.0, 14.0]], dtype=torch.float64)
    out = group_advantages(returns, "mean", normalize_std=False)
    _close(out, [[-2.0, -1.0, 0.0, 3.0], [-1.0, -1.0, -1.0, 3.0]], atol=1e-12)


def test_constant_group_gives_zero_with_std() -> None:
    # std 0: (R - mean) = 0, divided by eps, stays 0 (no NaN).
    out = group_advantages(torch.full((1, 3), 0.7), "mean", normalize_std=True)
    assert torch.equal(out, torch.zeros(1, 3))


def test_group_of_one_mean_is_zero() -> None:
    out = group_advantages(torch.tensor([[5.0]]), "mean", normalize_std=True)
    assert torch.equal(out, torch.zeros(1, 1))


def test_dtype_and_device_preserved() -> None:
    out = group_advantages(torch.tensor([R], dtype=torch.float32), "rloo", normalize_std=True)
    assert out.dtype == torch.float32 and out.shape == (1, 4)


def test_rloo_needs_two_samples() -> None:
    with pytest.raises(ValueError, match=r"baseline 'rloo' needs G >= 2.*shape \(3, 1\)"):
        group_advantages(torch.zeros(3, 1), "rloo", normalize_std=False)


def test_unknown_baseline() -> None:
    with pytest.raises(ValueError, match=r"baseline must be one of .*'median'"):
        group_advantages(_returns(), "median", normalize_std=False)


def test_wrong_shape() -> None:
    with pytest.raises(
        ValueError, match=r"returns must have shape \[num_groups, G\] with G >= 1, got shape \(4,\)"
    ):
        group_advantages(torch.tensor(R), "mean", normalize_std=False)


def test_nan_and_int_returns_raise() -> None:
    with pytest.raises(ValueError, match=r"returns contains NaN or inf"):
        group_advantages(torch.tensor([[1.0, float("nan")]]), "mean", normalize_std=False)
    with pytest.raises(ValueError, match=r"returns must be a floating-point tensor"):
        group_advantages(torch.tensor([[1, 2]]), "mean", normalize_std=False)
    with pytest.raises(ValueError, match=r"eps must be > 0, got 0"):
        group_advantages(_returns(), "mean", normalize_std=True, eps=0)


def test_normalize_batch_hand() -> None:
    # Same numbers over the whole batch: (R - 3) / (sqrt(3.5) + 1e-8).
    out = normalize_batch(torch.tensor([[1.0, 2.0], [3.0, 6.0]], dtype=torch.float64))
    _close(out, [[-1.0690450, -0.5345225], [0.0, 1.6035675]], atol=1e-6)


def test_normalize_batch_of_one_is_zero_not_nan() -> None:
    out = normalize_batch(torch.tensor([4.2]))
    assert torch.equal(out, torch.zeros(1))
    assert torch.equal(normalize_batch(torch.full((5,), 3.0)), torch.zeros(5))


def test_normalize_batch_bad_inputs() -> None:
    with pytest.raises(ValueError, match=r"adv contains NaN or inf"):
        normalize_batch(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match=r"adv is empty"):
        normalize_batch(torch.zeros(0))


def test_pooled_std_of_moments_hand() -> None:
    # R: count 4, sum 12, sum of squares 1 + 4 + 9 + 36 = 50; 50/4 - 3**2 = 3.5
    assert pooled_std(4, 12.0, 50.0) == pytest.approx(STD, abs=1e-12)
    # Two shares of R ([1, 2] and [3, 6]) add their moments to the same figure.
    assert pooled_std(2 + 2, 3.0 + 9.0, 5.0 + 45.0) == pytest.approx(STD, abs=1e-12)
    assert pooled_std(3, 6.0, 12.0) == 0.0  # [2, 2, 2]
    with pytest.raises(ValueError, match="count must be > 0, got 0"):
        pooled_std(0, 0.0, 0.0)


def test_one_std_for_every_row_when_given() -> None:
    # Rows [1, 3] and [2, 6]: their own stds are 1 and 2; the batch's (of 1, 3, 2, 6) sqrt(3.5).
    returns = torch.tensor([[1.0, 3.0], [2.0, 6.0]], dtype=torch.float64)
    _close(group_advantages(returns, "mean", True), [[-1.0, 1.0], [-1.0, 1.0]])
    batch = group_advantages(returns, "mean", True, std=STD)
    _close(batch, [[-1 / STD, 1 / STD], [-2 / STD, 2 / STD]])
    # Without normalize_std the std is not used.
    _close(group_advantages(returns, "mean", False, std=STD), [[-1.0, 1.0], [-2.0, 2.0]])
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="std must be a finite float >= 0"):
            group_advantages(returns, "mean", True, std=bad)
