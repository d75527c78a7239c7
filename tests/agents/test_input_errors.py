"""Inputs that used to run silently or fail with a foreign error (issue 9, items 13-18)."""

from __future__ import annotations

import math

import pytest

from cmlrl_agents import IACConfig, MAACConfig, MAGRPOConfig

INF = math.inf


# ------------------------------------------------------------------ 13. config values
@pytest.mark.parametrize(
    ("config_class", "field"),
    [
        (MAGRPOConfig, "agent_learning_rate"),
        (MAGRPOConfig, "temperature"),
        (MAGRPOConfig, "reference_kl_coef"),
        (MAGRPOConfig, "max_grad_norm"),
        (MAGRPOConfig, "early_termination_threshold"),
        (IACConfig, "critic_learning_rate"),
        (IACConfig, "value_loss_coef"),
        (IACConfig, "value_clip_range"),
        (IACConfig, "ppo_clip_range"),
        (MAACConfig, "value_loss_coef"),
    ],
)
@pytest.mark.parametrize("value", [INF, -INF])
def test_infinite_numbers_are_refused_with_the_field_named(config_class, field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be (finite|>|>=)"):
        config_class(**{field: value})
    config = config_class()
    before = getattr(config, field)
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        setattr(config, field, value)
    assert getattr(config, field) == before


def test_infinite_positive_values_name_finiteness():
    with pytest.raises(ValueError, match=r"^agent_learning_rate must be finite, got inf\.$"):
        MAGRPOConfig(agent_learning_rate=INF)
    with pytest.raises(ValueError, match=r"max_grad_norm must be finite, got inf \(None turns"):
        MAGRPOConfig(max_grad_norm=INF)


def test_seed_must_fit_numpy():
    assert MAGRPOConfig(seed=2**32 - 1).seed == 2**32 - 1
    with pytest.raises(ValueError, match=r"seed must be <= 4294967295 .*got 4294967296"):
        MAGRPOConfig(seed=2**32)
    with pytest.raises(ValueError, match=r"seed must be >= 0, got -1"):
        MAGRPOConfig(seed=-1)


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_output_dir_is_refused(value):
    with pytest.raises(ValueError, match=r"output_dir=.* is empty; give a folder path, or None"):
        MAGRPOConfig(output_dir=value)


def test_zero_epochs_are_refused():
    with pytest.raises(ValueError, match=r"num_train_epochs must be >= 1, got 0"):
        MAGRPOConfig(num_train_epochs=0)
    with pytest.raises(ValueError, match=r"num_train_epochs must be >= 1, got 0"):
        IACConfig(num_train_epochs=0)
