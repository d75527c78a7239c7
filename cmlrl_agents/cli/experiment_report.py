"""An experiment's results: one table (Markdown, CSV, JSON) and one plot (PNG) from the
``result.json`` of every finished run.

A row is a (task, method): the eval reward before and after training as mean ± standard error
over seeds (with one seed, ± is the eval's own standard error, marked ``(eval)``), the change
and the mean of each run's own paired standard error of it, pass@1 / pass@k for code, the parse
rate of every one-model method (centralized: an answer under each heading; single: a split into
the two roles), turn 1 and turn 2 of a 2-turn run, and the compute (training tokens generated
against the budget, optimizer steps, seconds per round). Each task also gets the row "untrained
team": the team's evaluation before training. A second table, in the long form, holds every
measure of an eval point beside the reward: its levels, pass@1 and the writing content
measures (which the reward never sees), before / after / change.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cmlrl_agents.cli.experiment_eval import mean_se

__all__ = ["summary_rows", "write_report"]

COLUMNS = (
    *("task", "method", "seeds", "eval_samples", "before", "after", "change", "run_change_se"),
    *("pass@1", "pass@k", "parse_rate", "turn_1", "turn_2"),
    *("train_tokens", "token_budget", "optimizer_steps", "s_per_round", "cpu_s_per_round"),
    *("eval_s_per_pass", "wall_s"),
)
MEASURE_COLUMNS = ("task", "method", "measure", "trained_on", "before", "after", "change")


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
    pairs = list(zip(first, last, strict=True))
    row: dict[str, Any] = {
        "task": task,
        "method": "untrained team" if untrained else method,
        "seeds": len(results),
        "eval_samples": shown[0]["samples"],
        "before": _pm([p["reward"] for p in first], first[0]["reward_se"]),
    }
    if not untrained:
        row["after"] = _pm([p["reward"] for p in last], last[0]["reward_se"])
        row["change"] = _pm([b["reward"] - a["reward"] for a, b in pairs])
        # The eval items are fixed, so a run's change has the two points' sampling noise only.
        own = [math.hypot(a["reward_se"], b["reward_se"]) for a, b in pairs]
        row["run_change_se"] = f"{sum(own) / len(own):.3f}" if all(map(math.isfinite, own)) else ""
    turn = f"turn_{results[0]['num_turns']}/"
    for key in (k for k in shown[0] if k.startswith(turn + "pass@")):
        label = key.removeprefix(turn)
        column = "pass@1" if label == "pass@1" else "pass@k"
        row[column] = ("" if column == "pass@1" else f"{label}: ") + _pm([p[key] for p in shown])
    if "parse_rate" in shown[0]:
        after = _pm([p["parse_rate"] for p in shown])
        before = mean_se([p["parse_rate"] for p in first])[0]
        row["parse_rate"] = after if untrained else f"{before:.3f} → {after}"
    if results[0]["num_turns"] > 1:
        for t in (1, 2):
            row[f"turn_{t}"] = _pm([p[f"turn_{t}/reward"] for p in shown])
    if not untrained:
        budgets = [r["rounds"] * r["token_budget_per_round_turn_1"] for r in results]
        row["token_budget"] = f"{mean_se(budgets)[0]:.0f}"
        for key in (c for c in COLUMNS[COLUMNS.index("train_tokens") :] if c != "token_budget"):
            row[key] = f"{mean_se([r[key] for r in results])[0]:.0f}"
    return row


def _measure_rows(task: str, method: str, results: list[dict[str, Any]]) -> list[dict]:
    """The long table: one row per level, pass rate and content measure of the last turn."""
    turn = f"turn_{results[0]['num_turns']}/"
    first = [r["points"][0] for r in results]
    last = [r["points"][-1] for r in results]
    rows = []
    for key in (k for k in last[0] if k.startswith(turn) and k.count("/") >= 1):
        name = key.removeprefix(turn)
        if not name.startswith(("level/", "content/", "pass@")):
            continue
        rows.append(
            {
                "task": task,
                "method": method,
                "measure": name,
                "trained_on": "yes" if name.startswith("level/") else "no",
                "before": _pm([p[key] for p in first]),
                "after": _pm([p[key] for p in last]),
                "change": _pm([b[key] - a[key] for a, b in zip(first, last, strict=True)]),
            }
        )
    return rows


def _answer_splits(kind: str, text: str) -> bool:
    """Whether one model's answer holds both roles its reward scores: two paragraphs
    (writing, ``split_single_text``) or an ``aux`` beside the rest (code)."""
    if kind == "writing":
        from cmlrl_env.writing_tasks import split_single_text

        return split_single_text(text)[1] != ""
    from cmlrl_env.code_static import extract_code, split_single_program

    return split_single_program(extract_code(text))[0] != ""


def finished_result(run: Any, kind: str) -> dict[str, Any]:
    """A finished run's ``result.json``; for the single-agent baseline, each point gets the
    rate of answers that split into both roles (``parse_rate``), read from the completions
    stored in ``eval-samples.jsonl``."""
    result = run.result()
    samples_path = run.folder / "eval-samples.jsonl"
    if run.method != "single" or not samples_path.is_file():
        return result
    lines = samples_path.read_text(encoding="utf-8").splitlines()
    for point, line in zip(result["points"], lines, strict=True):
        answers = [s["completions"][0][-1] for s in json.loads(line)["samples"]]
        point["parse_rate"] = sum(_answer_splits(kind, a) for a in answers) / len(answers)
    return result


def summary_rows(plan: Any, runs: Sequence[Any]) -> dict[str, list[dict[str, Any]]]:
    """``rows``: one per (task, method) with finished runs, after the task's untrained-team
    row; ``measures``: the long table of ``_measure_rows``; ``notes``: a line per method that
    never parsed (every answer scored the parse-failure reward)."""
    out: dict[str, list[Any]] = {"rows": [], "measures": [], "notes": []}
    for task, settings in plan.tasks.items():
        done: dict[str, list[dict[str, Any]]] = {}
        for run in runs:
            if run.task == task and run.finished():
                done.setdefault(run.method, []).append(finished_result(run, settings["kind"]))
        if "team" in done:
            out["rows"].append(_row(task, "team", done["team"], untrained=True))
        for method, results in done.items():
            out["rows"].append(_row(task, method, results, untrained=False))
            out["measures"] += _measure_rows(task, method, results)
            rates = [p.get("parse_rate") for r in results for p in r["points"]]
            if all(rate == 0 for rate in rates):
                out["notes"].append(
                    f"{task}/{method} never parsed: every eval answer of every seed scored the "
                    "parse-failure reward, so its rewards measure the format, not the task."
                )
    return out


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> list[str]:
    used = [c for c in columns if any(r.get(c) not in (None, "") for r in rows)]
    lines = ["| " + " | ".join(used) + " |", "|" + "---|" * len(used)]
    return lines + ["| " + " | ".join(str(r.get(c, "")) for c in used) + " |" for r in rows]


def _seeds(plan: Any) -> str:
    """The seeds, with those of each task that has its own."""
    own = [
        f"{name}: {task['seeds']}"
        for name, task in plan.tasks.items()
        if task["seeds"] != plan.seeds
    ]
    return f"{plan.seeds}" + (f" ({'; '.join(own)})" if own else "")


def _markdown(report: dict[str, list[Any]], plan: Any) -> str:
    lines = [
        f"# Results of {plan.source}",
        "",
        f"Model: {plan.model}; seeds: {_seeds(plan)}. Eval reward: the mean over the eval samples "
        "(items × samples per item) of the last turn; ± is the standard error over seeds "
        "(with one seed, the eval's own standard error); run_change_se: the mean of each run's "
        "own standard error of its change (the eval items are fixed, so the two points' "
        "sampling noise). parse_rate, before → after: centralized, an answer under every "
        "heading; single, an answer that splits into both roles. token_budget: the most "
        "tokens training could generate (turn 1's for a 2-turn run); train_tokens: what it "
        "generated. Compute columns: means per run.",
        "",
        *_table(report["rows"], COLUMNS),
        "",
        "## The reward's levels and the measures it does not train on",
        "",
        "Means over seeds of each eval point's mean (last turn); ± the standard error over seeds.",
        "",
        *_table(report["measures"], MEASURE_COLUMNS),
    ]
    if report["notes"]:
        lines += ["", *(f"- {note}" for note in report["notes"])]
    return "\n".join(lines) + "\n"


def write_report(plan: Any, runs: Sequence[Any]) -> dict[str, Path]:
    """Write ``results.md``, ``results.csv`` (the main table), ``results.json`` (both tables,
    the notes and every run's points) and ``results.png`` into the experiment's folder;
    returns their paths by suffix."""
    from cmlrl_agents.cli.experiment_plot import plot_results
    from cmlrl_agents.cli.experiment_runs import provenance

    folder = plan.output_dir
    folder.mkdir(parents=True, exist_ok=True)
    report = summary_rows(plan, runs)
    paths = {s: folder / f"results.{s}" for s in ("md", "csv", "json", "png")}
    paths["md"].write_text(_markdown(report, plan), encoding="utf-8")
    with paths["csv"].open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows({c: r.get(c, "") for c in COLUMNS} for r in report["rows"])
    finished = [r.result() for r in runs if r.finished()]
    record = {
        "source": plan.source,
        "overrides": plan.overrides,
        "library": provenance(),  # the table's; each run's own is in its result
        **report,
        "runs": finished,
    }
    paths["json"].write_text(json.dumps(record, indent=1), "utf-8")
    plot_results(plan, finished, paths["png"])
    return paths
