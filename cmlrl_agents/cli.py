"""The ``cmlrl`` command: train, evaluate, check and plot from a YAML run file.

    cmlrl train RUN.yaml [--set config.agent_learning_rate=1e-5 ...] [--resume latest]
    cmlrl eval RUN.yaml [--checkpoint PATH|latest] [--num-eval-samples N]
    cmlrl check RUN.yaml | cmlrl check --task length_ratio | --dataset M:F --reward M:F ...
    cmlrl plot RUN_DIR | cmlrl plot RUN_DIR/trees/env_step-000000.json

A run file has the sections ``algorithm``, ``model``, ``task``, ``config`` and ``wandb`` (see
``docs/experiments.md``). Mistakes in it exit with status 2 and one line naming the valid choices;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmlrl_agents.checkpoint import latest_checkpoint
from cmlrl_agents.cli_tasks import (
    SECTIONS,
    TRAINER_CALLBACKS,
    CLIError,
    TaskParts,
    apply_overrides,
    build_task,
    check_keys,
    check_task_section,
    load_spec,
    one_line,
    task_from_flags,
)
from cmlrl_agents.config import SharedConfig
from cmlrl_agents.logging import WANDB_CONFIG_KEYS
from cmlrl_agents.plotting import plot_metrics, plot_run
from cmlrl_agents.runs import foreign_checkpoints
from cmlrl_agents.team import MODEL_CONFIG_KEYS

__all__ = ["ALGORITHMS", "BUILTIN_MODELS", "MODEL_KEYS", "Plan", "build_trainer", "main", "plan"]

# Imported on use: the actor-critic trainers may be missing from an installation.
ALGORITHMS = {
    "magrpo": "cmlrl_agents.magrpo:MAGRPOTrainer",
    "mareinforce": "cmlrl_agents.magrpo:MAREINFORCETrainer",
    "maremax": "cmlrl_agents.magrpo:MAReMaxTrainer",
    "marloo": "cmlrl_agents.magrpo:MARLOOTrainer",
    "iac": "cmlrl_agents.actor_critic:IACTrainer",
    "maac": "cmlrl_agents.actor_critic:MAACTrainer",
    "magrpo_centralized": "cmlrl_agents.centralized:CentralizedMAGRPOTrainer",
}
# Algorithms that train one model for every role of the task.
SINGLE_POLICY_ALGORITHMS = ("magrpo_centralized",)
BUILTIN_MODELS = ("tiny", "smollm2")
MODEL_KEYS = ("name_or_path", "critic_name_or_path", *MODEL_CONFIG_KEYS)
_USER_ERRORS = (ValueError, TypeError, ImportError, FileNotFoundError, AttributeError)


def trainer_class(name: Any) -> type:
    """The trainer registered under ``name`` (imported now)."""
    if name not in ALGORITHMS:
        raise CLIError(f"unknown algorithm {name!r}; valid: {', '.join(ALGORITHMS)}.")
    module, _, attr = ALGORITHMS[name].partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CLIError(f"algorithm {name!r} is not available in this installation: {exc}") from None


@dataclass
class Plan:
    """A validated run file, before any model is loaded."""

    algorithm: str
    trainer_class: type
    config: SharedConfig
    task: TaskParts
    model: dict[str, Any] | None
    wandb: dict[str, Any] | None


def plan(spec: Mapping[str, Any], *, need_model: bool = True) -> Plan:
    """Check every section of ``spec`` and resolve the task; loads no model."""
    check_keys(spec, SECTIONS, "section")
    algorithm = spec.get("algorithm", "magrpo")
    cls = trainer_class(algorithm)
    task = build_task(spec.get("task"))
    config = _config(cls.config_class, spec.get("config"), task.config_defaults)
    wandb = spec.get("wandb")
    if wandb is False:
        wandb = None
    if wandb is not None:
        if not isinstance(wandb, Mapping):
            raise CLIError(f"wandb must be a mapping (or null to turn W&B off), got {wandb!r}.")
        check_keys(wandb, WANDB_CONFIG_KEYS, "wandb key")
    model = _model_section(spec.get("model")) if need_model or "model" in spec else None
    p = Plan(algorithm, cls, config, task, model, None if wandb is None else dict(wandb))
    _check_fit(p)
    return p


def _check_fit(p: Plan) -> None:
    """Refuse task callbacks and critics that the algorithm would not use."""
    params = inspect.signature(p.trainer_class).parameters
    for name in p.task.callbacks:
        if name not in params:
            takes = [c for c in TRAINER_CALLBACKS if c in params]
            raise CLIError(
                f"task.{name} is not used by algorithm {p.algorithm!r}; it takes {takes}."
            )
    if p.model and "critic_name_or_path" in p.model and not _num_critics(p, 1):
        why = " with use_separate_critic=false" if p.algorithm == "iac" else ""
        raise CLIError(f"model.critic_name_or_path is not used by algorithm {p.algorithm!r}{why}.")


def _config(cls: type[SharedConfig], section: Any, defaults: Mapping[str, Any]) -> SharedConfig:
    if section is not None and not isinstance(section, Mapping):
        raise CLIError(f"config must be a mapping of {cls.__name__} fields, got {section!r}.")
    valid = [f.name for f in dataclasses.fields(cls)]
    check_keys(section or {}, valid, f"config field of {cls.__name__}")
    try:
        return cls(**{**defaults, **(section or {})})
    except (TypeError, ValueError) as exc:
        raise CLIError(f"config: {exc}") from None


def _model_section(section: Any) -> dict[str, Any]:
    if section is None:
        raise CLIError(
            f"the run file has no model section; give `model: NAME` with NAME one of "
            f"{list(BUILTIN_MODELS)}, a hub id or a local folder, or `model: {{name_or_path: "
            "..., dtype: ..., device: ...}`."
        )
    if isinstance(section, str):
        section = {"name_or_path": section}
    if not isinstance(section, Mapping):
        raise CLIError(f"model must be a name or a mapping, got {section!r}.")
    check_keys(section, MODEL_KEYS, "model key")
    if not section.get("name_or_path"):
        raise CLIError(f"model needs name_or_path: one of {list(BUILTIN_MODELS)}, or a path.")
    return dict(section)


def _models(name: str, count: int, model_config: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """Trainer arguments for ``count`` models named ``name``: built-in, hub id or folder."""
    if name == "tiny":
        from cmlrl_agents.testing import tiny_agent

        keys = ("chat_template", "system_prompt", "device")
        options = {k: model_config[k] for k in keys if k in model_config}
        return {"agents": [tiny_agent(seed + i, **options) for i in range(count)]}
    if name == "smollm2":
        from cmlrl_agents.policy import smollm2_path

        return {"agent_model": str(smollm2_path(model_config.get("cache_dir")))}
    return {"agent_model": name}


def build_trainer(p: Plan, *, use_wandb: bool = True, agent_dirs: Sequence[Path] = ()) -> Any:
    """The trainer of a plan; ``agent_dirs`` (one ``save_model`` folder per agent) replace the
    run file's model."""
    assert p.model is not None, "plan(..., need_model=True) first"
    num_agents = p.config.num_agents or p.task.num_agents or 2
    model_config = {k: v for k, v in p.model.items() if k in MODEL_CONFIG_KEYS}
    name = str(p.model["name_or_path"])
    if agent_dirs:
        models: dict[str, Any] = {"agents": [str(d) for d in agent_dirs]}
    else:
        count = 1 if p.algorithm in SINGLE_POLICY_ALGORITHMS else num_agents
        models = _models(name, count, model_config, seed=0)
    num_critics = _num_critics(p, num_agents)
    if num_critics:
        critic = _models(
            str(p.model.get("critic_name_or_path", name)), num_critics, model_config, seed=100
        )
        models |= {"critic_model": critic.get("agent_model"), "critics": critic.get("agents")}
    task = p.task
    return p.trainer_class(
        **models,
        model_config=model_config or None,
        train_dataset=task.train_dataset,
        eval_dataset=task.eval_dataset,
        formatters=task.formatters,
        reward_func=task.reward_func,
        reward_processor=task.reward_processor,
        external_transition=task.external_transition,
        wandb_config=p.wandb if use_wandb else None,
        args=p.config,
        **task.callbacks,
    )


def _num_critics(p: Plan, num_agents: int) -> int:
    if "critic_model" not in inspect.signature(p.trainer_class).parameters:
        return 0
    if p.algorithm == "maac":
        return 1
    return num_agents if getattr(p.config, "use_separate_critic", True) else 0


@contextmanager
def _user_errors(debug: bool) -> Iterator[None]:
    """Errors raised while reading the run file and building the trainer are the user's to fix:
    show them as one line, not a traceback (unless ``--debug``)."""
    try:
        yield
    except _USER_ERRORS as exc:
        if debug:
            raise
        raise CLIError(one_line(exc)) from exc


def _read(args: argparse.Namespace) -> dict[str, Any]:
    spec = load_spec(args.config) if args.config else {}
    if args.config:  # a run file's `module:function` paths may name modules beside it
        _add_to_path(Path(args.config).resolve().parent)
    return apply_overrides(spec, args.set)


def _add_to_path(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


# -- commands -----------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    with _user_errors(args.debug):
        p = plan(_read(args))
        _check_run_folder(p.config, args.resume)  # before any model is loaded
        trainer = build_trainer(p)
    model_dir = None if args.no_save_model else trainer.run_dir / "model"
    try:
        with _hf_progress_bars(trainer.logger.verbose):
            metrics = _train_and_save(trainer, args.resume, model_dir)
    except KeyboardInterrupt:
        print(f"\ninterrupted; run folder: {trainer.run_dir}", file=sys.stderr)
        return 130
    finally:
        trainer.close()
    plot = plot_metrics(trainer.run_dir) if (trainer.run_dir / "metrics.jsonl").is_file() else None
    if metrics:
        print(json.dumps(metrics, indent=2, sort_keys=True))
    else:
        print("no eval dataset: skipped the final evaluation")
    print(f"run folder: {trainer.run_dir}")
    if plot is not None:
        print(f"reward plot: {plot}")
    if model_dir is not None:
        print(f"trained model: {model_dir} (agent_0/, agent_1/, ... load with from_pretrained)")
    return 0


def _train_and_save(trainer: Any, resume: str | None, model_dir: Path | None) -> dict[str, float]:
    """Train, evaluate once more (the "after" numbers) and save the agents; the final metrics."""
    trainer.train(resume_from_checkpoint=resume)
    metrics = {}
    if trainer.eval_dataset is not None:
        metrics = trainer.evaluate_items(trainer.args.eval_num_samples)
    if model_dir is not None:
        trainer.save_model(model_dir)
    return metrics


@contextmanager
def _hf_progress_bars(enabled: bool) -> Iterator[None]:
    # save_pretrained draws a "Writing model shards" bar of its own; verbose=False means silence.
    from transformers.utils import logging as hf_logging

    silence = not enabled and hf_logging.is_progress_bar_enabled()
    if silence:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if silence:
            hf_logging.enable_progress_bar()


def cmd_eval(args: argparse.Namespace) -> int:
    with _user_errors(args.debug):
        p = plan(_read(args))
        checkpoint, agent_dirs, run_dir = _evaluated_weights(args.checkpoint, p.config)
        output = args.output_dir or (run_dir / "eval" if run_dir is not None else None)
        p.config.output_dir = None if output is None else str(output)
        if p.task.eval_dataset is None:
            raise CLIError("the task has no eval dataset; give task.eval_dataset or test_size.")
        trainer = build_trainer(p, use_wandb=False, agent_dirs=agent_dirs)
        if checkpoint is not None:
            trainer.load_checkpoint(checkpoint)
        n = p.config.eval_num_samples if args.num_eval_samples is None else args.num_eval_samples
        if n < 1:
            raise CLIError(f"--num-eval-samples must be >= 1, got {n}.")
    try:
        metrics = trainer.evaluate_items(n)
    finally:
        trainer.close()
    print(json.dumps(metrics, indent=2, sort_keys=True))
    print(f"eval metrics: {trainer.run_dir / 'eval-metrics.json'}")
    return 0


def _check_run_folder(config: SharedConfig, resume: str | None) -> None:
    """``--resume`` names a checkpoint that exists; a fresh run does not land in another's."""
    if resume == "latest":
        _latest(config)
    elif resume is not None:
        if not (Path(resume) / "trainer_state.json").is_file():
            raise CLIError(
                f"--resume {resume!r}: no checkpoint there (a checkpoint-<n> folder holds "
                "trainer_state.json); give a checkpoint folder or 'latest'."
            )
    elif config.output_dir is not None and not config.overwrite_output_dir:
        found = foreign_checkpoints(Path(config.output_dir) / "checkpoints", run_id="")
        if found:
            raise CLIError(
                f"{config.output_dir} holds checkpoints of an earlier run ({found[-1].name}); "
                "continue it with --resume latest, replace it with --set "
                "config.overwrite_output_dir=true, or choose another config.output_dir."
            )


def _latest(config: SharedConfig) -> Path:
    if config.output_dir is None:
        raise CLIError(
            "'latest' needs config.output_dir: the run folder whose checkpoints/ to use."
        )
    found = latest_checkpoint(Path(config.output_dir) / "checkpoints")
    if found is None:
        raise CLIError(f"{config.output_dir}/checkpoints holds no complete checkpoint.")
    return found


def _evaluated_weights(
    given: str | None, config: SharedConfig
) -> tuple[Path | None, list[Path], Path | None]:
    """(checkpoint folder, save_model agent folders, run folder) for ``--checkpoint``."""
    run_dir = None if config.output_dir is None else Path(config.output_dir)
    if given is None:
        return None, [], run_dir
    path = _latest(config) if given == "latest" else Path(given)
    if (path / "trainer_state.json").is_file():  # run/checkpoints/checkpoint-N
        return path, [], run_dir or path.parent.parent
    agents = sorted(
        (d for d in path.glob("agent_*") if d.name[6:].isdigit()), key=lambda d: int(d.name[6:])
    )
    if agents and all((d / "config.json").is_file() for d in agents):  # run/model from save_model
        if config.num_agents not in (None, len(agents)):
            raise CLIError(
                f"{path} holds {len(agents)} agents, config.num_agents is {config.num_agents}."
            )
        return None, agents, run_dir or path.parent
    raise CLIError(
        f"--checkpoint {given!r} is neither a checkpoint folder (with trainer_state.json) nor a "
        "save_model folder (with agent_0/, agent_1/, ...)."
    )


def cmd_check(args: argparse.Namespace) -> int:
    with _user_errors(args.debug):
        spec = _read(args)
        flags = {
            k: getattr(args, k) for k in ("task", "dataset", "reward", "formatters", "transition")
        }
        spec["task"] = task_from_flags(spec.get("task"), **flags)
        p = plan(spec, need_model=False)
    report, ok = check_task_section(p.task, p.config)
    print(report)
    return 0 if ok else 1


def cmd_plot(args: argparse.Namespace) -> int:
    with _user_errors(args.debug):
        paths = plot_run(args.run_dir, output=args.output)
    print("\n".join(str(p) for p in paths))
    return 0


# -- argument parsing ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cmlrl", description="Cooperative multi-LLM RL from a YAML run file."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks of user errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    overrides = argparse.ArgumentParser(add_help=False)
    overrides.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a run-file value (a YAML scalar), e.g. config.agent_learning_rate=1e-5",
    )
    train = commands.add_parser("train", parents=[overrides], help="train, evaluate, plot")
    train.add_argument("config", help="the YAML run file")
    train.add_argument("--resume", metavar="PATH|latest", help="continue from a checkpoint")
    train.add_argument("--no-save-model", action="store_true", help="skip RUN_DIR/model/")
    train.set_defaults(handler=cmd_train)
    evaluate = commands.add_parser("eval", parents=[overrides], help="evaluate on the eval split")
    evaluate.add_argument("config", help="the YAML run file")
    evaluate.add_argument(
        "--checkpoint",
        metavar="PATH|latest",
        help="a checkpoint folder, a save_model folder, or latest",
    )
    evaluate.add_argument("--num-eval-samples", type=int, metavar="N")
    evaluate.add_argument("--output-dir", type=Path, help="default: RUN_DIR/eval")
    evaluate.set_defaults(handler=cmd_eval)
    check = commands.add_parser("check", parents=[overrides], help="check a task without a model")
    check.add_argument("config", nargs="?", help="a YAML run file (or give the task by flags)")
    check.add_argument(
        "--task",
        metavar="NAME|MODULE:FUNCTION",
        help="a built-in task or a function returning a task section",
    )
    check.add_argument("--dataset", metavar="MODULE:FUNCTION")
    check.add_argument("--reward", metavar="MODULE:FUNCTION")
    check.add_argument("--formatters", nargs="+", metavar="MODULE:FUNCTION")
    check.add_argument("--transition", metavar="MODULE:FUNCTION")
    check.set_defaults(handler=cmd_check)
    plot = commands.add_parser(
        "plot", help="draw a run folder's reward plot and rollout trees, or one tree's JSON"
    )
    plot.add_argument("run_dir", type=Path, metavar="RUN_DIR|TREE.json")
    plot.add_argument(
        "--output", type=Path, help="default: RUN_DIR/rewards.png, or TREE.png beside the JSON"
    )
    plot.set_defaults(handler=cmd_plot, set=[])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``cmlrl`` command; returns the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help and usage errors
        return exc.code if isinstance(exc.code, int) else 2
    args.debug = args.debug or bool(os.environ.get("CMLRL_DEBUG"))
    # A console script's sys.path lacks the working folder; run files name modules there.
    _add_to_path(Path.cwd())
    try:
        return args.handler(args)
    except CLIError as exc:
        print(f"cmlrl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
