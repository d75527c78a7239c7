"""Reward curves from a run folder's `metrics.jsonl` (written by `MetricsLogger`), and
`plot_run`, which also redraws the run's rollout trees (what `cmlrl plot` does)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cmlrl_agents.foundation.metrics import turn_key

__all__ = ["plot_metrics", "plot_run", "reward_figure"]

Series = dict[int, tuple[list[int], list[float]]]
"""Per 1-based turn: (env steps, reward means)."""
Errors = dict[int, list[float]]
"""Per 1-based turn: the standard error of each evaluation point (0 where none was logged)."""


def _read_series(metrics_file: Path) -> tuple[Series, Series, Errors]:
    train: Series = {}
    evaluation: Series = {}
    errors: Errors = {}
    lines = metrics_file.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            step = int(entry["env_step"])
        except (ValueError, KeyError, TypeError) as error:
            raise ValueError(
                f"{metrics_file}:{number} is not a metrics entry with an env_step ({error}); "
                "plot_metrics reads the metrics.jsonl that MetricsLogger writes."
            ) from None
        # Looked up by the names metrics.turn_key builds, never parsed back from the keys; an
        # entry has fewer turns than keys, which bounds the search.
        for turn in range(1, len(entry) + 1):
            for target, prefix in ((train, ""), (evaluation, "eval/")):
                value = entry.get(turn_key(turn, "reward_mean", prefix))
                if not _finite(value):
                    continue
                steps, values = target.setdefault(turn, ([], []))
                steps.append(step)
                values.append(float(value))
                if target is evaluation:
                    sem = entry.get(turn_key(turn, "reward_sem", prefix))
                    errors.setdefault(turn, []).append(float(sem) if _finite(sem) else 0.0)
    return train, evaluation, errors


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def reward_figure(train: Series, evaluation: Series, errors: Errors, title: str) -> Figure:
    """Training means as lines (a lone point as a dot, or it would not show), evaluation means
    as markers with ±1 standard error bars."""
    figure = Figure(figsize=(8, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    colors = [f"C{i}" for i in range(10)]
    for turn in sorted(train):
        steps, values = train[turn]
        axes.plot(
            steps,
            values,
            color=colors[(turn - 1) % 10],
            marker="o" if len(steps) == 1 else None,
            label=f"train turn {turn}",
        )
    for turn in sorted(evaluation):
        steps, values = evaluation[turn]
        axes.errorbar(
            steps,
            values,
            yerr=errors[turn],
            color=colors[(turn - 1) % 10],
            linestyle="--",
            marker="o",
            capsize=3,
            label=f"eval turn {turn} (±1 s.e.)",
        )
    axes.set_title(title)
    axes.set_xlabel("env_step (joint-action reward evaluations)")
    axes.set_ylabel("reward_mean")
    axes.grid(True, alpha=0.3)
    if train or evaluation:
        axes.legend()
    else:
        axes.text(0.5, 0.5, "no reward metrics logged", ha="center", va="center")
    return figure


def plot_metrics(run_dir: str | Path, *, output: str | Path | None = None) -> Path:
    """Plot `turn_k/reward_mean` (lines) and `eval/turn_k/reward_mean` (markers, with
    `eval/turn_k/reward_sem` as error bars) by env_step.

    Reads `run_dir/metrics.jsonl`, writes `run_dir/rewards.png` (or `output`) and returns its
    path. Uses matplotlib's Agg canvas directly, so it never changes the pyplot backend.
    """
    run_dir = Path(run_dir)
    metrics_file = run_dir / "metrics.jsonl"
    if not metrics_file.is_file():
        raise FileNotFoundError(
            f"run_dir={str(run_dir)!r} has no metrics.jsonl; pass the output_dir of a run "
            "logged with MetricsLogger."
        )
    train, evaluation, errors = _read_series(metrics_file)
    figure = reward_figure(train, evaluation, errors, f"Mean reward per turn: {run_dir.name}")
    path = Path(output) if output is not None else run_dir / "rewards.png"
    figure.savefig(path, dpi=120)
    return path


def plot_run(target: str | Path, *, output: str | Path | None = None) -> list[Path]:
    """What ``cmlrl plot`` draws; returns the files written.

    A run folder: ``rewards.png`` (when it has ``metrics.jsonl``) and every rollout tree saved in
    ``trees/*.json`` (PNG and HTML beside each). A tree's ``.json``: that tree, to ``output`` or
    beside the JSON.
    """
    from cmlrl_agents.runs.tree_plot import draw_rollout_tree
    from cmlrl_agents.runs.tree_view import TreeView

    target = Path(target)
    if target.suffix == ".json":
        png, page = draw_rollout_tree(TreeView.load(target), output or target.with_suffix(".png"))
        return [png] if page is None else [png, page]
    trees = sorted((target / "trees").glob("*.json"))
    if output is not None and trees:
        raise ValueError(
            f"output={str(output)!r} names one file but {target} has {len(trees)} rollout trees "
            "as well; leave output out, or plot one tree's .json."
        )
    paths = []
    if (target / "metrics.jsonl").is_file() or not trees:
        paths.append(plot_metrics(target, output=output))
    for tree in trees:
        png, page = draw_rollout_tree(TreeView.load(tree), tree.with_suffix(".png"))
        paths += [png] if page is None else [png, page]
    return paths
