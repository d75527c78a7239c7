"""The main job over seeds: each run's evaluations, CPU minutes and peak RSS, then the spread.

    python results/main-job-seeds/summarize.py results/main-job-seeds
    python results/main-job-seeds/summarize.py results/main-job-seeds/kl \
        --paired results/main-job-seeds

reads ``seed-*/metrics.jsonl`` (the run folder's, the last evaluation being the one after
training) and ``seed-*/time-v.txt`` (``/usr/bin/time -v``) under the folder given; with
``--paired``, also the final evaluations of the same seeds under another folder, and prints the
paired differences' mean and standard error.
"""

import argparse
import json
import re
import statistics
from pathlib import Path

KEY = "eval/turn_1/reward_mean"


def evaluations(folder: Path) -> list[float]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [row[KEY] for row in rows if KEY in row]


def cpu_minutes_and_peak_gb(folder: Path) -> tuple[float, float]:
    text = (folder / "time-v.txt").read_text()
    user = float(re.search(r"User time \(seconds\): ([\d.]+)", text).group(1))
    system = float(re.search(r"System time \(seconds\): ([\d.]+)", text).group(1))
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return (user + system) / 60, peak_kb / 1e6


def seeds(root: Path) -> dict[int, Path]:
    return {int(p.name.split("-")[1]): p for p in root.glob("seed-*")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--paired", type=Path, help="the runs to pair with, seed by seed")
    args = parser.parse_args()
    runs = seeds(args.root)
    finals, changes, dipped = {}, [], 0
    print("| seed | evaluations (before each epoch, then the end) | after | CPU min | peak GB |")
    print("|---|---|---|---|---|")
    for seed in sorted(runs):
        evals = evaluations(runs[seed])
        minutes, peak = cpu_minutes_and_peak_gb(runs[seed])
        finals[seed] = evals[-1]
        changes.append(evals[-1] - evals[0])
        dipped += any(e < evals[0] for e in evals[1:])
        shown = ", ".join(f"{e:.3f}" for e in evals)
        print(f"| {seed} | {shown} | {evals[-1]:.3f} | {minutes:.1f} | {peak:.2f} |")
    after = list(finals.values())
    print(
        f"\n{len(after)} seeds: after {statistics.mean(after):.3f} ± "
        f"{statistics.stdev(after):.3f} (mean ± sd), worst seed's change {min(changes):+.3f}, "
        f"{sum(f >= 0.9 for f in after)} of {len(after)} end ≥ 0.9, "
        f"{sum(c < 0 for c in changes)} below their start, "
        f"{dipped} below their start at some evaluation"
    )
    if args.paired is not None:
        base = seeds(args.paired)
        diffs = [finals[s] - evaluations(base[s])[-1] for s in sorted(finals)]
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        shown = ", ".join(f"{d:+.3f}" for d in diffs)
        mean = statistics.mean(diffs)
        print(f"paired with {args.paired}: {shown}; mean {mean:+.3f} (SE {se:.3f})")


if __name__ == "__main__":
    main()
