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


def _code_task(
    formatters: list[Callable[..., str]], reward: Callable[..., Any], num_turns: int
) -> Callable[[], tuple[dict[str, Any], dict[str, Any]]]:
    """A HumanEval task factory: the team's (or one agent's) formatters and reward."""

    def factory() -> tuple[dict[str, Any], dict[str, Any]]:
        pieces = {
            "dataset": code_tasks.humaneval_splits,
            "formatters": formatters,
            "reward": reward,
            "transition": code_tasks.code_feedback,
            "eval_logger": code_metrics.code_eval_logger,
            "eval_aggregator": code_metrics.code_eval_aggregator,
        }
        defaults = {"num_turns": num_turns, "early_termination_threshold": CODE_EARLY_TERMINATION}
        return pieces, defaults

    return factory


def _writing() -> tuple[dict[str, Any], dict[str, Any]]:
    pieces = {
        "dataset": writing_tasks.writing_splits,
        "formatters": [writing_tasks.summary_formatter, writing_tasks.expansion_formatter],
        "reward": writing_tasks.writing_reward,
    }
    return pieces, {}


PAPER_TASKS: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]]] = {
    "humaneval": _code_task(
        [code_tasks.helper_formatter, code_tasks.main_formatter], code_tasks.humaneval_reward, 2
    ),
    "humaneval_single": _code_task(
        [code_tasks.single_formatter], code_tasks.humaneval_single_reward, 1
    ),
    "writing": _writing,
}
