"""The MAGRPO paper's tasks as built-in ``cmlrl`` task names (``task: humaneval`` and so on).

Each factory returns (the task section's pieces, config defaults the run file may override).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cmlrl_env import code_metrics, code_tasks, writing_tasks

__all__ = ["PAPER_TASKS"]

# A joint answer that reaches the maximum (4.0) needs no second turn; others get feedback.
CODE_EARLY_TERMINATION = 3.9


def _humaneval() -> tuple[dict[str, Any], dict[str, Any]]:
    pieces = {
        "dataset": code_tasks.humaneval_splits,
        "formatters": [code_tasks.helper_formatter, code_tasks.main_formatter],
        "reward": code_tasks.humaneval_reward,
        "transition": code_tasks.code_feedback,
        "eval_logger": code_metrics.code_eval_logger,
        "eval_aggregator": code_metrics.code_eval_aggregator,
    }
    return pieces, {"num_turns": 2, "early_termination_threshold": CODE_EARLY_TERMINATION}


def _humaneval_single() -> tuple[dict[str, Any], dict[str, Any]]:
    pieces = {
        "dataset": code_tasks.humaneval_splits,
        "formatters": [code_tasks.single_formatter],
        "reward": code_tasks.humaneval_single_reward,
        "transition": code_tasks.code_feedback,
        "eval_logger": code_metrics.code_eval_logger,
        "eval_aggregator": code_metrics.code_eval_aggregator,
    }
    return pieces, {"num_turns": 1, "early_termination_threshold": CODE_EARLY_TERMINATION}


def _writing() -> tuple[dict[str, Any], dict[str, Any]]:
    pieces = {
        "dataset": writing_tasks.writing_splits,
        "formatters": [writing_tasks.summary_formatter, writing_tasks.expansion_formatter],
        "reward": writing_tasks.writing_reward,
    }
    return pieces, {}


PAPER_TASKS: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]]] = {
    "humaneval": _humaneval,
    "humaneval_single": _humaneval_single,
    "writing": _writing,
}
