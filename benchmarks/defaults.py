"""Choosing defaults over seeds: the seed's program out of the box, one setting at a time.

The program is ``benchmarks/learning.py --program all10``: two SmolLM2-135M-Instruct agents,
chat-templated formatters as a comlrl user writes them, the seed's 10 length-ratio prompts,
G = 4, 48 new tokens, one epoch, evaluated on the same 10 prompts (``--eval-repeats`` samples
each) before and after training. Every setting of ``--grid`` (the library's defaults when none)
runs once per ``--seeds`` seed, each in a fresh child process, and the table gives the mean and
the spread over the seeds of the reward before and after, the worst seed's change, and the
training time. The target is the comlrl figure of ``--yardstick`` (its 2-epoch final, measured
on this program by ``python benchmarks/learning.py --only comlrl --program all10 --items 10
--epochs 2 --comlrl-lr 2e-5 --eval-repeats 4``; ``--seed`` sets torch's generator for comlrl):
after one epoch, the mean over seeds at least that, and no seed below where it started.

    python benchmarks/defaults.py --seeds 0 1 2                       # the defaults
    python benchmarks/defaults.py --seeds 0 1 2 --grid agent_learning_rate=5e-5,1e-4 \\
        --grid rollout_buffer_size=2,4                                 # 4 settings x 3 seeds

The rewards do not depend on the machine's load: each row draws from its sampling key (the
config's seed, the item, the turn, the sample), so a run repeats exactly; only its seconds do.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import learning


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="a config field and the values to try (repeatable: every combination)",
    )
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--eval-repeats", type=int, default=4, help="samples of each prompt")
    parser.add_argument("--yardstick", type=float, default=None, help="comlrl's final reward")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", help="model folder (default: the local SmolLM2-135M-Instruct)")
    parser.add_argument("--json", type=Path, help="also write every run's result here")
    args = parser.parse_args(argv)
    if any(s < 0 for s in args.seeds) or args.epochs < 1 or args.eval_repeats < 1:
        parser.error("seeds must be >= 0, --epochs and --eval-repeats >= 1")
    return args


def grid(entries: list[str]) -> list[dict[str, Any]]:
    """Every combination of ``FIELD=V1,V2`` entries (values read as JSON, else text)."""
    axes = []
    for entry in entries:
        field, sep, values = entry.partition("=")
        if not sep or not field or not values:
            raise SystemExit(f"--grid expects FIELD=V1,V2, got {entry!r}")
        axes.append([(field, learning.override(f"{field}={v}")[1]) for v in values.split(",")])
    return [dict(combo) for combo in itertools.product(*axes)] or [{}]


def one_run(args: argparse.Namespace, setting: dict[str, Any], seed: int) -> dict:
    argv = [
        "--only",
        "cmlrl",
        "--program",
        "all10",
        "--items",
        "10",
        "--epochs",
        str(args.epochs),
        "--eval-every",
        "10",
        "--eval-repeats",
        str(args.eval_repeats),
        "--seed",
        str(seed),
        "--threads",
        str(args.threads),
    ]
    argv += [f"--set={k}={json.dumps(v)}" for k, v in setting.items()]
    argv += ["--model", args.model]
    run_args = learning.parse_args(argv)
    return learning.run("cmlrl", run_args, None)


def summary(results: list[dict]) -> dict[str, float]:
    before = [r["before"] for r in results]
    after = [r["after"] for r in results]

    def spread(values: list[float]) -> float:
        return statistics.stdev(values) if len(values) > 1 else 0.0

    return {
        "before": statistics.mean(before),
        "after": statistics.mean(after),
        "after_sd": spread(after),
        "worst_change": min(a - b for a, b in zip(after, before, strict=True)),
        "seconds": statistics.mean(r["seconds"] for r in results),
    }


def main(argv: list[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    if args.model is None:
        from cmlrl_agents import smollm2_path

        args.model = str(smollm2_path())
    settings = {
        ", ".join(f"{k}={v}" for k, v in s.items()) or "defaults": s for s in grid(args.grid)
    }
    results: dict[str, list[dict]] = {name: [] for name in settings}
    every: list[dict] = []
    for seed in args.seeds:  # seed-major: a first comparison of every setting comes early
        for name, setting in settings.items():
            r = one_run(args, setting, seed)
            print(f"{name} seed {seed}: {r['before']:.3f} -> {r['after']:.3f}", flush=True)
            results[name].append(r)
            every.append({"setting": setting, "seed": seed, **r})
    rows = {name: summary(runs) for name, runs in results.items()}
    print(
        f"\n{len(args.seeds)} seeds ({args.seeds}), {args.epochs} epoch(s), eval 10 prompts x "
        f"{args.eval_repeats}, {args.threads} thread(s)"
    )
    print("| setting | before | after (mean ± sd) | worst seed change | train s |")
    print("|---|---|---|---|---|")
    for name, s in rows.items():
        mark = ""
        if args.yardstick is not None:
            met = s["after"] >= args.yardstick and s["worst_change"] >= 0
            mark = " (target met)" if met else ""
        print(
            f"| {name} | {s['before']:.3f} | {s['after']:.3f} ± {s['after_sd']:.3f}{mark} | "
            f"{s['worst_change']:+.3f} | {s['seconds']:.0f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(every, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
