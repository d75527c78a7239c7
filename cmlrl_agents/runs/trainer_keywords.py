"""The keyword arguments every trainer takes for its team and task (SPEC §5, §6).

They are the seed's (and comlrl's) constructor keywords: the model forms (``agent_model`` /
``agents`` + ``tokenizer``), the task as loose pieces (``train_dataset``, ``formatters``,
``reward_func``, ...) or whole (``task=TaskSpec(...)``, ``env=CoMLRLEnv(...)``). Declared once
here as a ``TypedDict`` so that every trainer's ``**team: Unpack[TeamKeywords]`` is typed for
editors and checked at the call (``check_team_keywords``) without repeating the list.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

from datasets import Dataset, IterableDataset

from cmlrl_env import CoMLRLEnv, TaskSpec

__all__ = ["TASK_PIECES", "TeamKeywords", "check_team_keywords"]

TASK_PIECES = (
    "train_dataset",
    "formatters",
    "reward_func",
    "reward_processor",
    "external_transition",
)
"""The task as loose pieces; ``env=`` or ``task=`` holds them all, so neither goes with them."""


class TeamKeywords(TypedDict, total=False):
    agents: Sequence[Any] | None
    num_agents: int | None
    tokenizer: Any
    model_config: Mapping[str, Any] | None
    train_dataset: Dataset | IterableDataset | None
    eval_dataset: Dataset | IterableDataset | None
    reward_func: Callable[..., Any] | None
    reward_processor: Callable[[float], float] | None
    formatters: Any
    external_transition: Callable[..., Any] | None
    wandb_config: Mapping[str, Any] | None
    env: CoMLRLEnv | None
    task: TaskSpec | None
    peft_config: Any


def check_team_keywords(team: Mapping[str, Any], trainer: str, refused: Sequence[str] = ()) -> None:
    """A keyword that is not a ``TeamKeywords`` name (or is one the trainer ``refused``) is a
    TypeError naming it, as a misspelt keyword argument would be."""
    names = [n for n in TeamKeywords.__annotations__ if n not in refused]
    unknown = [k for k in team if k not in names]
    if unknown:
        raise TypeError(
            f"{trainer}() got unexpected keyword argument(s) {unknown}; it takes agent_model, "
            f"args, its own options and {names}."
        )
