"""The run file of the ``cmlrl`` command: YAML sections, ``--set`` overrides and the task section.

A run file has five sections (``SECTIONS``); this module reads it, applies overrides and turns
the ``task`` section into the pieces a trainer or an env takes. Every user mistake raises
``CLIError`` with the valid choices in its message; ``cmlrl`` prints it on one line (exit 2).
The trainer and model sections are built in ``cmlrl_agents.cli.commands``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset, DatasetDict, IterableDataset

# Reading the run file (YAML, --set, import paths) lives in cli_spec.py; re-exported here.
from cmlrl_agents.cli.paper_tasks import PAPER_TASKS
from cmlrl_agents.cli.spec import (
    SECTIONS,
    CLIError,
    apply_overrides,
    check_keys,
    load_spec,
    one_line,
    parse_value,
    resolve_import,
)
from cmlrl_env import RewardProcessors, TaskSpec, tasks

__all__ = [
    "BUILTIN_TASKS",
    "SECTIONS",
    "TASK_KEYS",
    "TRAINER_CALLBACKS",
    "CLIError",
    "TASK_SPEC_OPTIONS",
    "TaskSection",
    "apply_overrides",
    "build_task",
    "check_keys",
    "check_task_section",
    "load_spec",
    "one_line",
    "parse_value",
    "resolve_import",
    "task_from_flags",
]

# TaskSpec fields that the task section does not set under their own name: the pieces it names
# differently (reward, transition), the team size and turns (the config section's), and the
# item order (trainers read dataset order). Every other TaskSpec field is a task key as it is,
# so a new env option reaches the run file with no edit here.
_SPEC_FIELDS_SET_ELSEWHERE = (
    *("dataset", "formatters", "reward_func", "reward_processor", "external_transition"),
    *("num_agents", "num_turns", "early_termination_threshold", "item_order"),
)
TASK_SPEC_OPTIONS = tuple(
    f.name for f in dataclasses.fields(TaskSpec) if f.name not in _SPEC_FIELDS_SET_ELSEWHERE
)
TASK_KEYS = (
    *("name", "dataset", "dataset_kwargs", "eval_dataset", "test_size"),
    *("formatters", "reward", "reward_processor", "transition"),
    *("max_train_items", "max_eval_items"),
    *("eval_logger", "eval_aggregator", "metrics_callback"),
    *TASK_SPEC_OPTIONS,
)
# Trainer callbacks that a task may carry; only the trainers whose constructor takes them accept.
TRAINER_CALLBACKS = ("eval_logger", "eval_aggregator", "metrics_callback")
REWARD_PROCESSOR_STEPS = ("scale", "shift", "clip")


# -- the task section -------------------------------------------------------------------------


@dataclass
class TaskSection:
    """What the ``task`` section resolves to: the ``TaskSpec`` keywords it gives, the eval
    split and trainer callbacks; ``spec(config)`` adds the config's team size and turns."""

    spec_keywords: dict[str, Any]
    """``TaskSpec`` keyword arguments: dataset, formatters, reward_func, ... and options."""
    eval_dataset: Dataset | IterableDataset | None
    callbacks: dict[str, Callable[..., Any]] = field(default_factory=dict)
    config_defaults: dict[str, Any] = field(default_factory=dict)
    """Config fields the task needs unless the run file sets them (e.g. ``num_turns: 2``)."""

    @property
    def num_agents(self) -> int | None:
        formatters = self.spec_keywords.get("formatters")
        return len(formatters) if isinstance(formatters, list) else None

    def keywords(self, config: Any, *, num_agents: int | None = None) -> dict[str, Any]:
        """Every ``TaskSpec`` keyword of the run: the section's and the config's (``num_agents``
        replaces the config's team size, e.g. a centralized trainer's number of roles)."""
        return {
            **self.spec_keywords,
            "num_agents": num_agents or config.num_agents or self.num_agents,
            **config.task_settings(),
        }

    def spec(self, config: Any, *, num_agents: int | None = None) -> TaskSpec:
        """The run's one ``TaskSpec`` (what the trainer takes whole, as ``task=``)."""
        return TaskSpec(**self.keywords(config, num_agents=num_agents))


def _length_ratio() -> tuple[dict[str, Any], dict[str, Any]]:
    pieces = {
        "dataset": tasks.length_ratio_splits,
        "formatters": [tasks.brief_formatter, tasks.detailed_formatter],
        "reward": tasks.length_ratio_reward,
    }
    return pieces, {}


def _length_feedback() -> tuple[dict[str, Any], dict[str, Any]]:
    # Seed 002 has no held-out split: evaluation replays the four training prompts.
    pieces = {
        "dataset": lambda: (tasks.feedback_dataset(), tasks.feedback_dataset()),
        "reward": tasks.feedback_ratio_reward,
        "transition": tasks.length_feedback,
    }
    return pieces, {"num_turns": 2, "early_termination_threshold": 0.9}


BUILTIN_TASKS: dict[str, Callable[[], tuple[dict[str, Any], dict[str, Any]]]] = {
    "length_ratio": _length_ratio,
    "length_feedback": _length_feedback,
    **PAPER_TASKS,
}


def build_task(section: Any) -> TaskSection:
    """Resolve a ``task`` section: a mapping with the keys ``TASK_KEYS``, or just its ``name``.
    The name is a built-in task or ``"module:function"`` (a factory returning the keys); the
    other keys replace its pieces."""
    if section is None:
        raise CLIError(
            f"the run file has no task section; give `task: NAME` with NAME one of "
            f"{list(BUILTIN_TASKS)}, or `task: {{dataset: ..., reward: ..., ...}}`."
        )
    if isinstance(section, str):
        section = {"name": section}
    if not isinstance(section, Mapping):
        raise CLIError(f"task must be a name or a mapping, got {section!r}.")
    check_keys(section, TASK_KEYS, "task key")
    pieces, defaults = _named_task(section.get("name"))
    pieces.update({k: v for k, v in section.items() if k != "name"})
    for required in ("dataset", "reward"):
        if pieces.get(required) is None:
            raise CLIError(
                f"task needs {required!r} ('package.module:function') or a built-in name, one "
                f"of {list(BUILTIN_TASKS)}."
            )
    train, evaluation = _datasets(pieces)
    formatters = pieces.get("formatters")
    if isinstance(formatters, (list, tuple)):
        formatters = [resolve_import(f, f"task.formatters[{i}]") for i, f in enumerate(formatters)]
    else:
        formatters = resolve_import(formatters, "task.formatters")
    callbacks = {
        name: resolve_import(pieces[name], f"task.{name}")
        for name in TRAINER_CALLBACKS
        if pieces.get(name) is not None
    }
    spec_keywords = {
        "dataset": train,
        "formatters": formatters,
        "reward_func": resolve_import(pieces["reward"], "task.reward"),
        "reward_processor": _reward_processor(pieces.get("reward_processor")),
        "external_transition": resolve_import(pieces.get("transition"), "task.transition"),
        **{name: pieces[name] for name in TASK_SPEC_OPTIONS if name in pieces},
    }
    return TaskSection(spec_keywords, evaluation, callbacks, defaults)


def _named_task(name: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pieces, config defaults) of a built-in task or of a ``module:function`` task factory."""
    if name is None:
        return {}, {}
    if isinstance(name, str) and ":" in name:
        factory = resolve_import(name, "task")
        try:
            made = factory() if callable(factory) else None
        except TypeError as exc:  # e.g. a formatter named by mistake: it wants an item
            raise CLIError(f"task {name!r}() failed: {one_line(exc)}") from None
        if not isinstance(made, Mapping):
            raise CLIError(
                f"task {name!r} must be a function without arguments that returns a mapping of "
                f"task keys ({', '.join(TASK_KEYS[1:])})."
            )
        check_keys(made, [k for k in TASK_KEYS if k != "name"], f"task key from {name}")
        return dict(made), {}
    if name not in BUILTIN_TASKS:
        raise CLIError(
            f"unknown task name {name!r}; built-in tasks: {', '.join(BUILTIN_TASKS)} (or a "
            "'package.module:function' returning the task keys, or give dataset/reward/... "
            "without a name)."
        )
    return BUILTIN_TASKS[name]()


def _datasets(pieces: Mapping[str, Any]) -> tuple[Any, Any]:
    """(train, eval) from ``dataset`` (a dataset, a (train, eval) pair, a ``DatasetDict`` or a
    callable returning one), then ``eval_dataset``, ``test_size`` and the item limits."""
    made = _made_dataset(pieces["dataset"], "task.dataset", pieces.get("dataset_kwargs"))
    if isinstance(made, (Dataset, IterableDataset)):
        train, evaluation = made, None
    elif isinstance(made, (tuple, list)) and len(made) == 2:
        train, evaluation = made
    elif isinstance(made, (Mapping, DatasetDict)) and "train" in made:
        train = made["train"]
        evaluation = next((made[k] for k in ("test", "validation", "eval") if k in made), None)
    else:
        raise CLIError(
            f"task.dataset gave {type(made).__name__}; it must give a datasets.Dataset, an "
            "IterableDataset, a (train, eval) pair or a DatasetDict with a 'train' split."
        )
    if pieces.get("eval_dataset") is not None:
        evaluation = _made_dataset(pieces["eval_dataset"], "task.eval_dataset", None)
    test_size = pieces.get("test_size")
    if test_size is not None:
        if evaluation is not None or not isinstance(train, Dataset):
            raise CLIError(
                "task.test_size splits one map-style Dataset; the dataset already has an eval "
                "split (or is iterable). Drop test_size."
            )
        split = train.train_test_split(test_size=test_size, seed=42)
        train, evaluation = split["train"], split["test"]
    train = _limited(train, pieces.get("max_train_items"), "max_train_items")
    evaluation = _limited(evaluation, pieces.get("max_eval_items"), "max_eval_items")
    return train, evaluation


def _made_dataset(ref: Any, what: str, kwargs: Any) -> Any:
    obj = resolve_import(ref, what)
    if isinstance(obj, (Dataset, IterableDataset, DatasetDict, tuple, list)):
        return obj
    if not callable(obj):
        raise CLIError(f"{what} must be a dataset or a function returning one, got {obj!r}.")
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise CLIError(f"task.dataset_kwargs must be a mapping, got {kwargs!r}.")
    return obj(**dict(kwargs or {}))


def _limited(data: Any, limit: Any, name: str) -> Any:
    if limit is None or data is None:
        return data
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise CLIError(f"task.{name} must be an int >= 1, got {limit!r}.")
    if isinstance(data, Dataset):
        return data.select(range(min(limit, len(data))))
    return data.take(limit)


def _reward_processor(spec: Any) -> Callable[[float], float] | None:
    """``"module:function"``, or steps in order: ``{scale: 10, shift: -1, clip: [0, 5]}``."""
    if spec is None or not isinstance(spec, Mapping):
        return resolve_import(spec, "task.reward_processor")
    check_keys(spec, REWARD_PROCESSOR_STEPS, "task.reward_processor step")
    steps = []
    try:
        for name, arg in spec.items():
            if name == "clip":
                steps.append(RewardProcessors.clip(*arg))
            else:
                steps.append(getattr(RewardProcessors, name)(arg))
    except (TypeError, ValueError) as exc:
        raise CLIError(
            f"task.reward_processor: {one_line(exc)} (scale and shift take a number, clip "
            "takes [low, high])."
        ) from None
    return RewardProcessors.compose(*steps)


def task_from_flags(section: Any, task: str | None = None, **pieces: Any) -> Any:
    """The task section with ``cmlrl check``'s flags applied (``--task``, ``--reward``, ...)."""
    if task is not None:
        section = task
    pieces = {k: v for k, v in pieces.items() if v is not None}
    if not pieces:
        return section
    if isinstance(section, str):
        section = {"name": section}
    return {**(section or {}), **pieces}


def check_task_section(task: TaskSection, config: Any) -> tuple[str, bool]:
    """Run ``check_task`` and ``check_env`` on the task (no model): (the report, passed)."""
    from cmlrl_env import CoMLRLEnv, ConformanceError, TaskCheckError, check_env, check_task

    # Loose keywords, not a TaskSpec: check_task reports a piece that fails to bind as a
    # problem of its report, where building the spec first would stop at the first one.
    keywords = task.keywords(config)
    options = {name: keywords.pop(name) for name in TASK_SPEC_OPTIONS if name in keywords}
    lines, failed, warned = [], [], 0
    try:
        report = check_task(**keywords)
        lines.append(str(report))
        warned = len(report.warnings)
    except TaskCheckError as exc:
        lines.append(str(exc.report))
        failed.append(f"check_task found {len(exc.report.problems)} problem(s)")
    # Later turns go unchecked when the threshold ends every random episode after turn 1.
    if keywords["num_turns"] > 1:
        keywords["early_termination_threshold"] = None
    env_fn = functools.partial(CoMLRLEnv, **keywords, **options)
    try:
        passed = check_env(env_fn)
        lines.append(f"check_env: {len(passed)} checks passed ({', '.join(passed)})")
    except (ConformanceError, TaskCheckError) as exc:
        lines.append(f"check_env: {exc}")
        failed.append(f"check_env failed in {getattr(exc, 'check', 'a check')}")
    if failed:
        lines.append("FAILED: " + "; ".join(failed))
    elif warned:
        lines.append(
            f"OK: the task passes every check. The {warned} warning(s) above flag what works "
            "but may not be meant; none of them stops training."
        )
    else:
        lines.append("OK: the task passes every check.")
    return "\n".join(lines), not failed
