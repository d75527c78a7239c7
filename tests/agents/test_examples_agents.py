"""The main job's example runs end to end on a tiny model (the SmolLM2 run is the README's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_length_ratio_example_runs_on_a_tiny_model(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "length_ratio.py"),
            "--tiny",
            "--epochs",
            "1",
            "--max-new-tokens",
            "4",
            "--eval-repeats",
            "1",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval/turn_1/reward_mean: before" in proc.stdout
    metrics = json.loads((tmp_path / "eval-metrics.json").read_text())
    assert set(metrics) == {"eval/turn_1/reward_mean", "eval/turn_1/expected_return"}
    assert (tmp_path / "run" / "rewards.png").stat().st_size > 0
    assert (tmp_path / "run" / "metrics.jsonl").exists()
