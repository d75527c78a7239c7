"""An experiment's results: one table (Markdown, CSV, JSON) and one plot (PNG) from the
``result.json`` of every finished run.

A row is a (task, method): the eval reward before and after training as mean ± standard error
over seeds (with one seed, ± is the eval's own standard error, marked ``(eval)``), the change,
pass@1 / pass@k for code, the parse rate of the centralized baseline, turn 1 and turn 2 of a
2-turn run, and the compute (training tokens generated, optimizer steps, seconds per round).
Each task also gets the row "untrained team": the team's evaluation before training.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["mean_se", "summary_rows", "write_report"]

COLUMNS = (
    *("task", "method", "seeds", "eval_samples", "before", "after", "change"),
    *("pass@1", "pass@k", "parse_rate", "turn_1", "turn_2"),
    *("train_tokens", "optimizer_steps", "s_per_round", "cpu_s_per_round", "eval_s_per_pass"),
    "wall_s",
)


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n); NaN for fewer than 2 values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _pm(values: Sequence[float], eval_se: float | None = None) -> str:
    mean, se = mean_se(values)
    if math.isnan(mean):
        return ""
    if len(values) == 1 and eval_se is not None and not math.isnan(eval_se):
        return f"{mean:.3f} ± {eval_se:.3f} (eval)"
    return f"{mean:.3f}" if math.isnan(se) else f"{mean:.3f} ± {se:.3f}"


def _row(task: str, method: str, results: list[dict[str, Any]], untrained: bool) -> dict:
    first = [r["points"][0] for r in results]
    last = [r["points"][-1] for r in results]
    shown = first if untrained else last
    pairs = zip(first, last, strict=True)
    row: dict[str, Any] = {
        "task": task,
        "method": "untrained team" if untrained else method,
        "seeds": len(results),
        "eval_samples": shown[0]["samples"],
        "before": _pm([p["reward"] for p in first], first[0]["reward_se"]),
        "after": "" if untrained else _pm([p["reward"] for p in last], last[0]["reward_se"]),
        "change": "" if untrained else _pm([b["reward"] - a["reward"] for a, b in pairs]),
    }  # fmt: skip
    turn = f"turn_{results[0]['num_turns']}/"
    for key in (k for k in shown[0] if k.startswith(turn + "pass@")):
        label = key.removeprefix(turn)
        column = "pass@1" if label == "pass@1" else "pass@k"
        row[column] = ("" if column == "pass@1" else f"{label}: ") + _pm([p[key] for p in shown])
    if "parse_rate" in shown[0]:
        row["parse_rate"] = _pm([p["parse_rate"] for p in shown])
    if results[0]["num_turns"] > 1:
        for t in (1, 2):
            row[f"turn_{t}"] = _pm([p[f"turn_{t}/reward"] for p in shown])
    if not untrained:
        for key in COLUMNS[COLUMNS.index("train_tokens") :]:
            row[key] = f"{mean_se([r[key] for r in results])[0]:.0f}"
    return row


def summary_rows(plan: Any, runs: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per (task, method) with finished runs, after the task's untrained-team row."""
    rows = []
    for task in plan.tasks:
        done: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            if run.task == task and run.finished():
                done.setdefault(run.method, []).append(run.result())
        if "team" in done:
            rows.append(_row(task, "team", done["team"], untrained=True))
        rows.extend(_row(task, m, results, untrained=False) for m, results in done.items())
    return rows


def _markdown(rows: list[dict[str, Any]], plan: Any) -> str:
    used = [c for c in COLUMNS if any(r.get(c) not in (None, "") for r in rows)]
    lines = [
        f"# Results of {plan.source}",
        "",
        f"Model: {plan.model}; seeds: {plan.seeds}. Eval reward: the mean over the eval samples "
        "(items × samples per item) of the last turn; ± is the standard error over seeds "
        "(with one seed, the eval's own standard error). Compute columns: means per run.",
        "",
        "| " + " | ".join(used) + " |",
        "|" + "---|" * len(used),
    ]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in used) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write_report(plan: Any, runs: Sequence[Any]) -> dict[str, Path]:
    """Write ``results.md``, ``results.csv``, ``results.json`` and ``results.png`` into the
    experiment's folder; returns their paths by suffix."""
    from cmlrl_agents.cli.experiment_plot import plot_results

    folder = plan.output_dir
    folder.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(plan, runs)
    paths = {s: folder / f"results.{s}" for s in ("md", "csv", "json", "png")}
    paths["md"].write_text(_markdown(rows, plan), encoding="utf-8")
    with paths["csv"].open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows({c: r.get(c, "") for c in COLUMNS} for r in rows)
    finished = [r.result() for r in runs if r.finished()]
    from cmlrl_agents.cli.experiment_runs import provenance

    record = {
        "source": plan.source,
        "overrides": plan.overrides,
        "library": provenance(),  # the table's; each run's own is in its result
        "rows": rows,
        "runs": finished,
    }
    paths["json"].write_text(json.dumps(record, indent=1), "utf-8")
    plot_results(plan, finished, paths["png"])
    return paths
