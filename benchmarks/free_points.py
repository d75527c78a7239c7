"""What content-free answers score on the paper's rewards, beside the untrained team.

Prints, on the eval splits of the paper experiment, the mean reward (and its standard error
over items) of answers that carry nothing of the task:

- code (``humaneval_small_splits``, 14 eval problems, max 4.0): the identity team (helper
  ``def aux(x): return x``, main ``return aux(<first argument>)``), and empty functions (both
  bodies ``pass``);
- writing (``writing_news_splits``, the 50 eval passages, max 3.0): the passage's first 12
  words as the summary with a filler expansion ("However, for example, as a result," and 20
  distinct made-up words), and the same summary with the passage copied as the expansion;
- the untrained team: its stored eval completions from an experiment folder (the runs'
  ``eval-samples.jsonl`` before training), rescored, where they exist.

``--library PATH`` scores with the ``cmlrl_env`` of another checkout (e.g. a worktree of an
earlier commit), so the same answers are scored before and after a change of the rewards:

    python benchmarks/free_points.py
    git worktree add /tmp/before 7ad0160
    python benchmarks/free_points.py --library /tmp/before

No model runs: the answers are written here or read from disk.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

FILLER = "However, for example, as a result, " + " ".join(f"word{i}" for i in range(20))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", help="a checkout whose cmlrl_env scores (default: this one)")
    parser.add_argument(
        "--results",
        default=str(Path(__file__).resolve().parents[1] / "results" / "paper-small"),
        help="an experiment folder with the untrained team's eval samples",
    )
    return parser.parse_args(argv)


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _first_argument(item: dict[str, Any]) -> tuple[str, str]:
    """(the entry point's parameter list as written, its first parameter)."""
    tree = ast.parse(item["prompt"])
    entry = next(n for n in tree.body if getattr(n, "name", None) == item["entry_point"])
    names = [a.arg for a in entry.args.args]  # type: ignore[attr-defined]
    return ", ".join(names), names[0]


def code_answers(item: dict[str, Any]) -> dict[str, tuple[str, str]]:
    params, first = _first_argument(item)
    head = f"def {item['entry_point']}({params}):\n"
    return {
        "identity team": ("def aux(x):\n    return x\n", f"{head}    return aux({first})\n"),
        "empty functions": ("def aux(x):\n    pass\n", f"{head}    pass\n"),
    }


def writing_answers(passage: str) -> dict[str, tuple[str, str]]:
    lead = " ".join(passage.split()[:12])
    return {"lead-12 + filler": (lead, FILLER), "lead-12 + the passage": (lead, passage)}


def untrained_samples(results: Path, task: str) -> list[dict[str, Any]]:
    """The team's eval samples before training, over the finished seeds of ``task``."""
    samples = []
    for path in sorted((results / task / "team").glob("seed-*/eval-samples.jsonl")):
        with path.open(encoding="utf-8") as f:
            first = json.loads(f.readline())
        if first["rounds"] == 0:
            samples += first["samples"]
    return samples


def table(rows: dict[str, list[float]], maximum: float) -> list[str]:
    lines = [f"{'answer':<26} {'n':>4} {'mean':>7} {'± SE':>7}  (max {maximum})"]
    for name, values in rows.items():
        if not values:
            lines.append(f"{name:<26} {0:>4} {'n/a':>7}")
            continue
        mean, se = mean_se(values)
        lines.append(f"{name:<26} {len(values):>4} {mean:>7.3f} {se:>7.3f}")
    return lines


def score_code(
    reward: Callable[..., list[float]], items: list[dict[str, Any]], results: Path
) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {name: [] for name in code_answers(items[0])}
    for item in items:
        for name, (helper, main) in code_answers(item).items():
            rows[name] += reward([helper], [main], batch_items=[item])
    by_id = {item["task_id"]: item for item in items}
    rows["untrained team (stored)"] = [
        reward([s["completions"][0][0]], [s["completions"][1][0]], batch_items=[by_id[s["item"]]])[
            0
        ]
        for s in untrained_samples(results, "code")
        if s["item"] in by_id
    ]
    return rows


def score_writing(
    reward: Callable[..., list[float]], passages: list[str], results: Path
) -> dict[str, list[float]]:
    rows: dict[str, list[float]] = {name: [] for name in writing_answers(passages[0])}
    for passage in passages:
        for name, (summary, expansion) in writing_answers(passage).items():
            rows[name] += reward([summary], [expansion])
    stored = untrained_samples(results, "writing")
    pairs = [(s["completions"][0][0], s["completions"][1][0]) for s in stored]
    rows["untrained team (stored)"] = [reward([a], [b])[0] for a, b in pairs]
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.library:
        sys.path.insert(0, str(Path(args.library).resolve()))
    from cmlrl_env import code_tasks, writing_tasks

    print(f"cmlrl_env from {Path(code_tasks.__file__).parent}")
    results = Path(args.results)
    _, code_eval = code_tasks.humaneval_small_splits()
    code = score_code(code_tasks.humaneval_reward, [dict(r) for r in code_eval], results)
    print("\ncode: humaneval_small_splits eval, humaneval_reward")
    print("\n".join(table(code, 4.0)))
    _, writing_eval = writing_tasks.writing_news_splits()
    writing = score_writing(writing_tasks.writing_reward, list(writing_eval["prompt"]), results)
    print("\nwriting: writing_news_splits eval, writing_reward")
    print("\n".join(table(writing, 3.0)))


if __name__ == "__main__":
    main()
