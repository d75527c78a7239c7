"""``TaskSpec``: one frozen, validated description of a task that the env, ``check_task``, the
trainers and the CLI all take.

A task is its dataset and the pieces that turn an item into rewards: formatters (item ->
prompts), the reward function and its processor, the transition (turn k -> prompts of turn
k + 1), the number of turns, the early-termination threshold and the text limits. Before the
spec each consumer restated these as loose keywords; now an env option is one field here, used
where it acts (``CoMLRLEnv`` reads ``spec.max_prompt_chars`` and friends).

Validation happens at construction (``__post_init__``): the dataset as ``TaskSource`` checks it,
the pieces as ``Task`` binds them, the limits as the env checks them. ``task()`` and ``source()``
build the live objects (a ``Task`` warns once per instance, a ``TaskSource`` holds a position, so
each consumer gets its own).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from datasets import Dataset, IterableDataset

from cmlrl_env._errors import add_context
from cmlrl_env.core import DEFAULT_EARLY_TERMINATION_THRESHOLD, Task
from cmlrl_env.dataset import TaskSource
from cmlrl_env.formatters import Formatter
from cmlrl_env.rewards import RewardProcessor
from cmlrl_env.spaces import DEFAULT_MAX_CHARS

__all__ = ["TaskSpec"]


@dataclass(frozen=True)
class TaskSpec:
    """The task of one run; ``dataset=None`` describes a task without training items (a trainer
    that only evaluates and saves)."""

    dataset: Dataset | IterableDataset | None
    formatters: Formatter | Sequence[Formatter] | None = None
    reward_func: Callable[..., Any] | None = None
    reward_processor: RewardProcessor | None = None
    external_transition: Callable[..., Any] | None = None
    num_agents: int | None = None
    num_turns: int = 1
    early_termination_threshold: float | None = DEFAULT_EARLY_TERMINATION_THRESHOLD
    max_prompt_chars: int = DEFAULT_MAX_CHARS
    max_completion_chars: int = DEFAULT_MAX_CHARS
    item_order: str = "dataset"

    def __post_init__(self) -> None:
        if self.reward_func is None:
            raise TypeError(
                "the task needs reward_func: TaskSpec(dataset, formatters, reward_func) or "
                "CoMLRLEnv(dataset, formatters, reward_func)."
            )
        for name in ("max_prompt_chars", "max_completion_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")
        if self.dataset is not None:
            self.source()  # the dataset's and item_order's checks
        # The pieces' checks; the resolved team size is kept, so num_agents is always an int.
        task = self.task()
        object.__setattr__(self, "num_agents", task.num_agents)
        if isinstance(self.dataset, Dataset):
            _check_first_item(task, self.dataset)

    def task(self) -> Task:
        """A fresh ``Task`` over the spec's pieces (the pure core of the env's group step)."""
        return Task(
            self.formatters,
            self.reward_func,  # type: ignore[arg-type]  # checked in __post_init__
            num_agents=self.num_agents,
            num_turns=self.num_turns,
            external_transition=self.external_transition,
            reward_processor=self.reward_processor,
            early_termination_threshold=self.early_termination_threshold,
        )

    def source(self) -> TaskSource:
        """A fresh ``TaskSource`` over the dataset, at the start of its order."""
        if self.dataset is None:
            raise ValueError(
                "this TaskSpec has no dataset; build it with dataset=... to read items."
            )
        return TaskSource(self.dataset, item_order=self.item_order)

    def replace(self, **changes: Any) -> TaskSpec:
        """A copy with ``changes`` applied, validated again."""
        return dataclasses.replace(self, **changes)


def _check_first_item(task: Task, dataset: Dataset) -> None:
    """Build the first item's prompts now, so that a dataset the formatters cannot read (no
    ``prompt`` column for the default formatter, a misspelt field) fails when the env or trainer
    is built, not at the first ``reset()`` or rollout. A stream is not read here: reading it
    could use up a one-shot stream."""
    try:
        task.initial_state(dict(dataset[0]), 0)
    except Exception as exc:  # the formatter's own error, with its item and fields
        raise add_context(
            exc,
            f"checked when the task was built, on item 0 of the dataset (columns "
            f"{dataset.column_names}); fix the dataset's columns or the formatters.",
        ) from None
