"""The ``cmlrl`` command: train, evaluate, check and plot from a YAML run file.

    cmlrl train RUN.yaml [--set config.agent_learning_rate=1e-5 ...] [--resume latest]
    cmlrl eval RUN.yaml [--checkpoint PATH|latest|best] [--num-eval-samples N]
    cmlrl check RUN.yaml | cmlrl check --task length_ratio | --dataset M:F --reward M:F ...
    cmlrl plot RUN_DIR | cmlrl plot RUN_DIR/trees/env_step-000000.json
    cmlrl experiment EXPERIMENT.yaml [--set compute.epochs=2 ...]

A run file has the sections ``algorithm``, ``model``, ``task``, ``config`` and ``wandb`` (see
``docs/experiments.md``). Mistakes in it exit with status 2 and one line naming the valid choices;
``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cmlrl_agents.cli.spec import CLIError, add_to_path, apply_overrides, load_spec, one_line

# Each command imports what it needs when it runs, so that `cmlrl --help` and a usage error
# answer at once, and `cmlrl check` loads no model library (torch, transformers, peft).
if TYPE_CHECKING:
    from cmlrl_agents.foundation.config import SharedConfig

__all__ = ["main"]

_USER_ERRORS = (ValueError, TypeError, ImportError, FileNotFoundError, AttributeError)


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
        add_to_path(Path(args.config).resolve().parent)
    threads = getattr(args, "threads", None)
    extra = [] if threads is None else [f"config.num_threads={threads}"]
    return apply_overrides(spec, [*args.set, *extra])


# -- commands -----------------------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    from cmlrl_agents.cli.plan import build_trainer, plan
    from cmlrl_agents.runs.plotting import plot_metrics

    with _user_errors(args.debug):
        p = plan(_read(args), source=args.config)
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
    from cmlrl_agents.cli.adapters import load_adapter_folders
    from cmlrl_agents.cli.plan import build_trainer, plan
    from cmlrl_agents.runs.threads import apply_num_threads

    with _user_errors(args.debug):
        p = plan(_read(args), source=args.config)
        checkpoint, agent_dirs, run_dir = _evaluated_weights(args.checkpoint, p.config)
        output = args.output_dir or (run_dir / "eval" if run_dir is not None else None)
        p.config.output_dir = None if output is None else str(output)
        if p.task.eval_dataset is None:
            raise CLIError("the task has no eval dataset; give task.eval_dataset or test_size.")
        n = p.config.eval_num_samples if args.num_eval_samples is None else args.num_eval_samples
        if n < 1:  # before any model loads
            raise CLIError(f"--num-eval-samples must be >= 1, got {n}.")
        adapters = bool(agent_dirs) and (agent_dirs[0] / "adapter_config.json").is_file()
        if adapters and p.peft is None:
            raise CLIError(
                f"{agent_dirs[0].parent} holds adapters (save_model of adapter agents); give "
                "the run file's peft section they were trained with."
            )
        trainer = build_trainer(p, use_wandb=False, agent_dirs=() if adapters else agent_dirs)
        if adapters:
            load_adapter_folders(trainer.agents, agent_dirs)
        if checkpoint is not None:  # the weights alone: evaluation needs no optimizer state
            trainer.load_weights(checkpoint)
        elif agent_dirs and run_dir is not None and (run_dir / "config.json").is_file():
            # A run's saved agents evaluate with the run's seed, as its own evaluation did.
            recorded = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
            if isinstance(recorded.get("sample_seed"), int):
                trainer.sample_seed = recorded["sample_seed"]
    apply_num_threads(p.config.num_threads)  # train() applies it; evaluation alone here
    try:
        metrics = trainer.evaluate_items(n)
    finally:
        trainer.close()
    print(json.dumps(metrics, indent=2, sort_keys=True))
    print(f"eval metrics: {trainer.run_dir / 'eval-metrics.json'}")
    return 0


def _check_run_folder(config: SharedConfig, resume: str | None) -> None:
    """``--resume`` names a checkpoint that exists; a fresh run does not land in another's, and
    no run lands in a finished run of ``cmlrl experiment``."""
    from cmlrl_agents.runs.run_dirs import foreign_checkpoints

    if resume == "latest":
        _latest(config)
    elif resume is not None:
        if not (Path(resume) / "trainer_state.json").is_file():
            raise CLIError(
                f"--resume {resume!r}: no checkpoint there (a checkpoint-<n> folder holds "
                "trainer_state.json); give a checkpoint folder or 'latest'."
            )
    if config.output_dir is not None and (Path(config.output_dir) / "result.json").is_file():
        raise CLIError(
            f"{config.output_dir} is a finished run of `cmlrl experiment` (it holds result.json), "
            "whose files training there would replace; run it elsewhere with --set "
            "config.output_dir=<another folder>."
        )
    if resume is None and config.output_dir is not None and not config.overwrite_output_dir:
        found = foreign_checkpoints(Path(config.output_dir) / "checkpoints", run_id="")
        if found:
            raise CLIError(
                f"{config.output_dir} holds checkpoints of an earlier run ({found[-1].name}); "
                "continue it with --resume latest, replace it with --set "
                "config.overwrite_output_dir=true, or choose another config.output_dir."
            )


def _latest(config: SharedConfig) -> Path:
    from cmlrl_agents.runs.checkpoint import latest_checkpoint

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
    from cmlrl_agents.runs.checkpoint import latest_checkpoint

    run_dir = None if config.output_dir is None else Path(config.output_dir)
    if given is None:
        return None, [], run_dir
    if given == "best":  # what save_best_by kept
        if run_dir is None:
            raise CLIError("'best' needs config.output_dir: the run folder whose best/ to use.")
        found = latest_checkpoint(run_dir / "best")
        if found is None:
            raise CLIError(f"{run_dir}/best holds no best model (train with save_best_by).")
        return found, [], run_dir
    path = _latest(config) if given == "latest" else Path(given)
    if (path / "trainer_state.json").is_file():  # run/checkpoints/checkpoint-N
        return path, [], run_dir or path.parent.parent
    agents = sorted(
        (d for d in path.glob("agent_*") if d.name[6:].isdigit()), key=lambda d: int(d.name[6:])
    )
    adapters = agents and all((d / "adapter_config.json").is_file() for d in agents)
    if adapters or (agents and all((d / "config.json").is_file() for d in agents)):  # save_model
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
    from cmlrl_agents.cli.adapters import describe_peft
    from cmlrl_agents.cli.plan import plan
    from cmlrl_agents.cli.tasks import check_task_section, task_from_flags

    with _user_errors(args.debug):
        spec = _read(args)
        flags = {
            k: getattr(args, k) for k in ("task", "dataset", "reward", "formatters", "transition")
        }
        spec["task"] = task_from_flags(spec.get("task"), **flags)
        p = plan(spec, need_model=False, source=args.config or "the command line")
    report, ok = check_task_section(p.task, p.config)
    if p.peft is not None:
        print(describe_peft(p.peft))
    print(report)
    return 0 if ok else 1


def cmd_plot(args: argparse.Namespace) -> int:
    from cmlrl_agents.runs.plotting import plot_run

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
    overrides.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="PyTorch's CPU threads (config.num_threads); default: PyTorch's, one per core",
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
        metavar="PATH|latest|best",
        help="a checkpoint folder, a save_model folder, latest, or best (save_best_by's model)",
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
    from cmlrl_agents.cli.experiment import add_experiment_command

    add_experiment_command(commands)
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
    add_to_path(Path.cwd())
    try:
        return args.handler(args)
    except CLIError as exc:
        print(f"cmlrl {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
