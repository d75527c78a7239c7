"""The main job over seeds: each run's evaluations, CPU minutes and peak RSS, then the spread.

    python results/main-job-seeds/summarize.py results/main-job-seeds

reads ``seed-*/metrics.jsonl`` (the run folder's, the last evaluation being the one after
training) and ``seed-*/time-v.txt`` (``/usr/bin/time -v``) under the folder given.
"""

import json
import re
import statistics
import sys
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


def main() -> None:
    root = Path(sys.argv[1])
    finals, changes = [], []
    print("| seed | evaluations (before each epoch, then the end) | after | CPU min | peak GB |")
    print("|---|---|---|---|---|")
    for folder in sorted(root.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
        evals = evaluations(folder)
        minutes, peak = cpu_minutes_and_peak_gb(folder)
        finals.append(evals[-1])
        changes.append(evals[-1] - evals[0])
        shown = ", ".join(f"{e:.3f}" for e in evals)
        print(f"| {folder.name[5:]} | {shown} | {evals[-1]:.3f} | {minutes:.1f} | {peak:.2f} |")
    print(
        f"\n{len(finals)} seeds: after {statistics.mean(finals):.3f} ± "
        f"{statistics.stdev(finals):.3f} (mean ± sd), worst seed's change {min(changes):+.3f}, "
        f"{sum(f >= 0.9 for f in finals)} of {len(finals)} end ≥ 0.9, "
        f"{sum(c < 0 for c in changes)} below their start"
    )


if __name__ == "__main__":
    main()
