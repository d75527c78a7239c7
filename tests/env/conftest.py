"""Env factories shared by the env tests (once here instead of a copy per test file)."""

from __future__ import annotations

import functools
from collections.abc import Callable

import pytest

from cmlrl_env import CoMLRLEnv
from cmlrl_env.tasks import feedback_dataset, feedback_ratio_reward, length_feedback


@pytest.fixture
def feedback_env() -> Callable[..., CoMLRLEnv]:
    """A factory of seed 002's two-turn env, every turn played (keyword arguments override);
    a factory, not an env, because the checks build fresh envs with their own options."""
    return functools.partial(
        CoMLRLEnv,
        feedback_dataset(),
        None,
        feedback_ratio_reward,
        num_turns=2,
        external_transition=length_feedback,
        early_termination_threshold=None,
    )
