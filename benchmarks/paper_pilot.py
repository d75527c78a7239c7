"""The pilot that sizes the paper experiment: per task and method, one untrained evaluation
and a few training rounds, timed (wall and CPU seconds), with the tokens generated.

    python benchmarks/paper_pilot.py                                   # SmolLM2, the settings below
    python benchmarks/paper_pilot.py --set model=tiny --output-dir /tmp/pilot   # a smoke run

It runs ``examples/experiments/paper_small.yaml`` with one seed, the overrides of ``PILOT``
(2 rounds of 2 items per 1-turn method, 1 round for the 2-turn team, every eval item once) and
no evaluation after training, then prints one Markdown row per run: seconds and CPU seconds
per training round, tokens generated per round against the budget, seconds per eval pass and
per eval sample, and the untrained evaluation (reward mean, its std over samples and standard
error, pass@1, parse rate). docs/paper-experiment.md has the figures and the sizing they give.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's packages, not another installed copy
PILOT = [
    *("seeds=[0]", "compute.train_items=4", "compute.items_per_round=2", "compute.epochs=1"),
    *("eval.max_items=14", "eval.samples_per_item=1", "eval.pass_k=1", "eval.every_rounds=0"),
    *("tasks.writing.compute.train_items=4", "tasks.writing.eval.max_items=16"),
    "tasks.writing.seeds=[0]",
    *("tasks.code_2turn.compute.train_items=2", "tasks.code_2turn.eval.max_items=14"),
]


def row(result: dict) -> str:
    point = result["points"][0]
    last = f"turn_{result['num_turns']}"
    samples = point["samples"]
    cells = [
        f"{result['task']} / {result['method']}",
        f"{result['s_per_round']:.0f} ({result['cpu_s_per_round']:.0f})",
        f"{result['train_tokens_per_round']:.0f} / {result['token_budget_per_round_turn_1']}",
        f"{result['eval_s_per_pass']:.0f} ({result['eval_cpu_s_per_pass']:.0f})",
        f"{result['eval_cpu_s_per_pass'] / samples:.1f}",
        f"{point['reward']:.3f} ± {point['reward_se']:.3f}",
        f"{point[last + '/reward_std']:.3f}",
        str(samples),
    ]
    if not result["rounds"]:  # evaluated only
        cells[1] = cells[2] = "not trained"
    cells.append(f"{point['turn_1/pass@1']:.3f}" if "turn_1/pass@1" in point else "")
    cells.append(f"{point['parse_rate']:.3f}" if "parse_rate" in point else "")
    if result["num_turns"] > 1:
        cells[5] += f" (turn 1 {point['turn_1/reward']:.3f})"
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--output-dir", default="runs/paper-pilot")
    parser.add_argument(
        "--only", nargs="+", metavar="TASK/METHOD", help="these runs only (default: all)"
    )
    parser.add_argument(
        "--eval-only",
        nargs="+",
        default=[],
        metavar="TASK/METHOD",
        help="these runs evaluate the untrained model and do not train",
    )
    parser.add_argument(
        "--file", default=str(ROOT / "examples" / "experiments" / "paper_small.yaml")
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from cmlrl_agents.cli.experiment import load_experiment
    from cmlrl_agents.cli.experiment_runs import Progress, run_files, run_one

    plan = load_experiment(args.file, [*PILOT, *args.set])
    plan.output_dir = Path(args.output_dir)
    runs = run_files(plan)
    progress = Progress(runs, sys.stdout)
    header = (
        "| run | s per round (CPU s) | train tokens per round / budget | s per eval pass (CPU s) "
        "| CPU s per eval sample | untrained reward ± SE | reward std | eval samples | pass@1 "
        "| parse rate |"
    )
    rows = []
    for run in runs:
        key = f"{run.task}/{run.method}"
        if args.only and key not in args.only:
            continue
        progress.start(run)
        train = key not in args.eval_only
        done = run.finished()
        result = run.result() if done else run_one(run, progress, train=train, final_eval=False)
        rows.append(row(result))
        print(rows[-1], flush=True)
    progress.close()
    print("\n" + header + "\n|" + "---|" * 10 + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
