"""``cmlrl experiment FILE.yaml``: methods × tasks × seeds at equal compute, one table, one plot.

An experiment file names a model, seeds, a compute budget, an eval protocol and tasks, each
with the methods to compare (see ``examples/experiments/paper_small.yaml`` and
``docs/paper-experiment.md``). Every (task, method, seed) becomes a ``cmlrl`` run file
(``RUN/run.yaml``, trainable on its own with ``cmlrl train``) whose generation and optimizer
budget the runner derives from the one ``compute`` section, so that the methods cannot differ
in it (``experiment_runs.run_files``). Finished runs (``RUN/result.json``) are skipped when the
command is run again; a run that was interrupted starts again from its beginning. The results
table (``results.md``, ``.csv``, ``.json``) and the plot of eval reward against training
tokens (``results.png``) are written at the end from every finished run.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# The run files' YAML reading: duplicate keys refused, 1e-5 read as a number.
from cmlrl_agents.cli.spec import CLIError, _Loader, add_to_path, check_keys, parse_value

__all__ = ["ExperimentPlan", "add_experiment_command", "load_experiment", "run_experiment"]

TOP_KEYS = ("model", "seeds", "output_dir", "compute", "eval", "config", "tasks")
COMPUTE_KEYS = ("train_items", "epochs", "items_per_round", "num_generations", "max_new_tokens")
EVAL_KEYS = ("max_items", "samples_per_item", "every_rounds", "pass_k", "batch_size")
TASK_KEYS = (
    *("kind", "dataset", "dataset_kwargs", "num_turns", "methods", "baseline", "seeds"),
    *("compute", "eval", "config"),
)
METHODS = ("team", "single", "centralized")
KINDS = ("code", "writing")


@dataclass
class ExperimentPlan:
    """A checked experiment file: the top-level sections and each task's merged settings."""

    model: Any
    seeds: list[int]
    output_dir: Path
    tasks: dict[str, dict[str, Any]]
    """Per task: kind, dataset, num_turns, methods, seeds (its own or the top-level ones),
    baseline and its merged compute, eval and config sections."""
    source: str
    overrides: list[str] = field(default_factory=list)
    """The ``--set`` assignments applied to the file, in order."""


def load_experiment(
    path: str | Path, overrides: list[str] | tuple[str, ...] = ()
) -> ExperimentPlan:
    """Read and check an experiment file; ``overrides`` are ``a.b.c=value`` assignments."""
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"experiment file {str(path)!r} not found.")
    try:
        spec = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506
    except yaml.YAMLError as exc:
        raise CLIError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(spec, Mapping):
        raise CLIError(f"{path} must hold a mapping with the keys {list(TOP_KEYS)}.")
    spec = copy.deepcopy(dict(spec))
    for assignment in overrides:
        _assign(spec, assignment)
    check_keys(spec, TOP_KEYS, f"key of {path.name}")
    for key in ("model", "seeds", "tasks", "compute"):
        if key not in spec:
            raise CLIError(f"{path.name} needs the key {key!r}.")
    seeds = spec["seeds"]
    if not _distinct_ints(seeds):
        raise CLIError(f"seeds must be a non-empty list of distinct ints >= 0, got {seeds!r}.")
    if not isinstance(spec["tasks"], Mapping) or not spec["tasks"]:
        raise CLIError("tasks must be a mapping of task names to task settings.")
    _check_reach(spec, overrides)
    tasks = {str(name): _task(str(name), section, spec) for name, section in spec["tasks"].items()}
    for name, task in tasks.items():
        if task["baseline"] is not None and task["baseline"] not in tasks:
            raise CLIError(f"tasks.{name}.baseline {task['baseline']!r} is not a task here.")
    output = Path(spec.get("output_dir") or f"runs/{path.stem}")
    return ExperimentPlan(spec["model"], seeds, output, tasks, str(path), list(overrides))


def _assign(spec: dict[str, Any], assignment: str) -> None:
    key, sep, text = assignment.partition("=")
    if not sep or not key.strip():
        raise CLIError(f"--set {assignment!r} is not of the form key.subkey=value.")
    *parents, last = key.strip().split(".")
    target = spec
    for part in parents:
        nested = target.get(part)
        if target is spec and part == "model" and isinstance(nested, str):
            nested = {"name_or_path": nested}  # `model: tiny`, as `cmlrl train` reads it
        if nested is not None and not isinstance(nested, Mapping):
            raise CLIError(f"--set {key}: {part!r} is {nested!r}, not a mapping.")
        target[part] = dict(nested or {})
        target = target[part]
    target[last] = parse_value(text)


def _hidden_by(task: Any, key: str) -> tuple[str, Any] | None:
    """(the task's own key, its value) that hides the top-level ``key`` from the task, or
    None: a task's own ``seeds`` hide the top-level ones, its own ``compute.<field>`` (and
    ``eval``, ``config``) the top-level field."""
    if not isinstance(task, Mapping):
        return None
    if key == "seeds":
        return ("seeds", task["seeds"]) if "seeds" in task else None
    section, _, rest = key.partition(".")
    own = task.get(section)
    first = rest.split(".")[0]
    if section not in ("compute", "eval", "config") or not isinstance(own, Mapping):
        return None
    return (f"{section}.{first}", own[first]) if first in own else None


def _check_reach(spec: Mapping[str, Any], overrides: Sequence[str]) -> None:
    """A top-level override that a task's own setting hides from it changes nothing there:
    refuse it, naming the task and the override to use, unless that task's own setting is
    overridden too or already has the value."""
    keys = [a.partition("=")[0].strip() for a in overrides]
    tasks = spec.get("tasks")
    for assignment, key in zip(overrides, keys, strict=True):
        for name, task in tasks.items() if isinstance(tasks, Mapping) else ():
            hidden = _hidden_by(task, key)
            if hidden is None:
                continue
            own_key, value = hidden
            if any(k.startswith(f"tasks.{name}.{own_key}") for k in keys):
                continue
            if own_key == key and value == parse_value(assignment.partition("=")[2]):
                continue  # the task's own value is the override's already
            raise CLIError(
                f"--set {assignment!r} does not reach task {name}, whose own {own_key} is "
                f"{value!r}; add --set tasks.{name}.{own_key}=... for it."
            )


def _is_int(value: Any, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _merged(spec: Mapping[str, Any], section: Mapping[str, Any], key: str) -> dict[str, Any]:
    top, own = spec.get(key) or {}, section.get(key) or {}
    for where, value in ((key, top), (f"tasks.*.{key}", own)):
        if not isinstance(value, Mapping):
            raise CLIError(f"{where} must be a mapping, got {value!r}.")
    return {**top, **own}


def _task(name: str, section: Any, spec: Mapping[str, Any]) -> dict[str, Any]:
    """One task's settings, checked: its own compute/eval/config over the top-level ones."""
    if not isinstance(section, Mapping):
        raise CLIError(f"tasks.{name} must be a mapping with the keys {list(TASK_KEYS)}.")
    check_keys(section, TASK_KEYS, f"key of tasks.{name}")
    kind = section.get("kind")
    if kind not in KINDS:
        raise CLIError(f"tasks.{name}.kind must be one of {list(KINDS)}, got {kind!r}.")
    methods = section.get("methods", list(METHODS))
    if (
        not isinstance(methods, list)
        or not methods
        or any(m not in METHODS for m in methods)
        or len(set(methods)) < len(methods)
    ):
        raise CLIError(
            f"tasks.{name}.methods must list some of {list(METHODS)}, each once, got {methods!r}."
        )
    turns = section.get("num_turns", 1)
    if not _is_int(turns, 1) or (turns > 1 and (kind != "code" or methods != ["team"])):
        raise CLIError(
            f"tasks.{name}.num_turns={turns!r}: an int >= 1; more than one turn is the code "
            "task's team only (methods: [team]), whose feedback is code_feedback."
        )
    seeds = section.get("seeds", spec["seeds"])
    if not _distinct_ints(seeds):
        raise CLIError(
            f"tasks.{name}.seeds must be a non-empty list of distinct ints >= 0, got {seeds!r}."
        )
    compute = _merged(spec, section, "compute")
    check_keys(compute, COMPUTE_KEYS, f"compute key of {name}")
    for key in COMPUTE_KEYS:
        if not _is_int(compute.get(key), 1):
            raise CLIError(
                f"compute.{key} of task {name} must be an int >= 1, got {compute.get(key)!r}."
            )
    if compute["train_items"] % compute["items_per_round"]:
        raise CLIError(
            f"task {name}: compute.train_items={compute['train_items']} is not a multiple of "
            f"items_per_round={compute['items_per_round']}; every round must be full, so that "
            "every method gets the same rounds."
        )
    evaluation = _checked_eval(name, _merged(spec, section, "eval"), compute)
    return {
        "kind": kind,
        "dataset": section.get("dataset"),
        "dataset_kwargs": section.get("dataset_kwargs"),
        "num_turns": turns,
        "methods": methods,
        "seeds": seeds,
        "baseline": section.get("baseline"),
        "compute": compute,
        "eval": evaluation,
        "config": _checked_config(name, _merged(spec, section, "config")),
    }


RUNNER_FIELDS = {
    "num_generations": "compute.num_generations",
    "max_new_tokens": "compute.max_new_tokens",
    "rollout_buffer_size": "compute.items_per_round",
    "num_train_epochs": "compute.epochs",
    "num_turns": "tasks.<name>.num_turns",
    "eval_interval": "eval.every_rounds",
    "eval_batch_size": "eval.batch_size",
    "eval_num_samples": "eval.max_items and eval.samples_per_item",
    "seed": "seeds",
    "output_dir": "output_dir (or --output-dir)",
}
"""The config fields the runner sets from the experiment's own keys, each with its key."""
RUNNER_ONLY = (
    "train_batch_size",
    "overwrite_output_dir",
    "save_steps",
    "verbose",
    "num_agents",
    "parse_failure_reward",
)
"""Config fields the runner fixes for every run (one step per round, no checkpoints, ...)."""


def _checked_config(name: str, config: dict[str, Any]) -> dict[str, Any]:
    """A task's ``config``, refused where it names a field the runner sets itself (it would
    be overwritten without a word)."""
    for key in config:
        if key in RUNNER_FIELDS:
            raise CLIError(
                f"config.{key} of task {name} is set by the runner from "
                f"{RUNNER_FIELDS[key]}; set that instead."
            )
        if key in RUNNER_ONLY:
            raise CLIError(
                f"config.{key} of task {name} is fixed by the runner for every run "
                "(docs/paper-experiment.md); remove it."
            )
    return config


def _distinct_ints(values: Any) -> bool:
    """A non-empty list of distinct ints >= 0 (seeds: a repeated one would count twice)."""
    return (
        isinstance(values, list)
        and bool(values)
        and all(_is_int(v, 0) for v in values)
        and len(set(values)) == len(values)
    )


def _checked_eval(name: str, evaluation: dict[str, Any], compute: Mapping[str, Any]) -> dict:
    check_keys(evaluation, EVAL_KEYS, f"eval key of {name}")
    evaluation = {"samples_per_item": 1, "every_rounds": 0, "batch_size": 8} | evaluation
    evaluation.setdefault("pass_k", evaluation["samples_per_item"])
    for key in EVAL_KEYS:
        value = evaluation.get(key)
        if value is not None and not _is_int(value, 0 if key == "every_rounds" else 1):
            raise CLIError(f"eval.{key} of task {name} must be an int, got {value!r}.")
    if evaluation["pass_k"] > evaluation["samples_per_item"]:
        raise CLIError(
            f"eval.pass_k={evaluation['pass_k']} of task {name} is larger than "
            f"samples_per_item={evaluation['samples_per_item']}; pass@k needs n >= k samples."
        )
    rounds = compute["epochs"] * compute["train_items"] // compute["items_per_round"]
    if evaluation["every_rounds"] and rounds % evaluation["every_rounds"]:
        raise CLIError(
            f"eval.every_rounds={evaluation['every_rounds']} of task {name} does not divide its "
            f"{rounds} rounds; choose a divisor so that the last point is the trained model."
        )
    return evaluation


# -- the command ------------------------------------------------------------------------------


def run_experiment(
    plan: ExperimentPlan, *, out: Any = None, only: list[str] | tuple[str, ...] = ()
) -> dict[str, Path]:
    """Run every unfinished (task, method, seed), or those whose name
    (``task/method/seed-S``) is one of ``only`` or lies under one (a task or a task/method),
    every run's file checked first, then write the table and the plot
    from every finished run of the plan; returns their paths."""
    from cmlrl_agents.cli.experiment_report import write_report
    from cmlrl_agents.cli.experiment_runs import Progress, check_runs, run_files, run_one

    out = sys.stdout if out is None else out
    every = run_files(plan)
    runs = [r for r in every if not only or any(_selects(o, r.name) for o in only)]
    if not runs:
        names = ", ".join(r.name for r in every[:4])
        raise CLIError(f"--only {list(only)} selects no run of {plan.source}; names: {names}, ...")
    check_runs(runs)
    progress = Progress(runs, out)
    start = time.perf_counter()
    for run in runs:
        progress.start(run)
        if run.finished():
            progress.skip(run)
            continue
        progress.done(run, run_one(run, progress))
    progress.close()
    paths = write_report(plan, every)
    print(f"{len(runs)} runs in {time.perf_counter() - start:.0f} s", file=out)
    for path in paths.values():
        print(path, file=out)
    return paths


def _selects(only: str, name: str) -> bool:
    """Whether ``--only`` names the run ``name`` or a task or method it lies under: ``code``
    selects ``code/team/seed-0``, not ``code_2turn/...``; ``seed-1`` is not ``seed-10``."""
    only = only.rstrip("/")
    return name == only or name.startswith(only + "/")


def cmd_experiment(args: argparse.Namespace) -> int:
    # Modules next to the experiment file (a task's dataset, say) import as next to a run file.
    add_to_path(Path(args.file).resolve().parent)
    try:
        plan = load_experiment(args.file, args.set)
        if args.output_dir is not None:
            plan.output_dir = Path(args.output_dir)
    except (ValueError, TypeError) as exc:
        if args.debug:
            raise
        raise CLIError(str(exc)) from exc
    try:
        run_experiment(plan, only=args.only)
    except KeyboardInterrupt:
        print(f"\ninterrupted; finished runs stay in {plan.output_dir}", file=sys.stderr)
        return 130
    return 0


def add_experiment_command(commands: Any) -> None:
    """Register ``cmlrl experiment`` on the ``cmlrl`` parser's subcommands."""
    parser = commands.add_parser(
        "experiment", help="methods x tasks x seeds at equal compute: one table, one plot"
    )
    parser.add_argument("file", help="the experiment YAML file")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.SUBKEY=VALUE",
        help="override a value of the file, e.g. compute.epochs=2 or seeds=[0]",
    )
    parser.add_argument("--output-dir", help="default: the file's output_dir")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TASK[/METHOD[/seed-S]]",
        help="run only this run, or the runs of this task or task/method (repeatable); the "
        "table and the plot still cover every finished run",
    )
    parser.set_defaults(handler=cmd_experiment)
