"""Cooperative multi-LLM tasks as a PettingZoo ``ParallelEnv`` (strings only; no torch)."""

from cmlrl_env.conformance import (
    ConformanceError,
    TaskCheckError,
    TaskReport,
    check_env,
    check_multi_turn_determinism,
    check_task,
    check_text_contract,
)
from cmlrl_env.core import (
    DEFAULT_EARLY_TERMINATION_THRESHOLD,
    MAX_AGENTS,
    EpisodeState,
    Outcome,
    Task,
)
from cmlrl_env.dataset import TaskSource
from cmlrl_env.env import CoMLRLEnv
from cmlrl_env.formatters import Formatters, default_formatter
from cmlrl_env.gymnasium_view import CoMLRLGymnasiumEnv, as_gymnasium
from cmlrl_env.rewards import RewardFunction, RewardProcessors
from cmlrl_env.spaces import TextSpace
from cmlrl_env.task_spec import TaskSpec
from cmlrl_env.transitions import Transition

__all__ = [
    "CoMLRLEnv",
    "CoMLRLGymnasiumEnv",
    "ConformanceError",
    "DEFAULT_EARLY_TERMINATION_THRESHOLD",
    "EpisodeState",
    "Formatters",
    "MAX_AGENTS",
    "Outcome",
    "RewardFunction",
    "RewardProcessors",
    "Task",
    "TaskCheckError",
    "TaskReport",
    "TaskSource",
    "TaskSpec",
    "TextSpace",
    "Transition",
    "as_gymnasium",
    "check_env",
    "check_multi_turn_determinism",
    "check_task",
    "check_text_contract",
    "default_formatter",
]
