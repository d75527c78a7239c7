"""The main job's example runs end to end on a tiny model (the SmolLM2 run is the README's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_length_ratio_example_with_smollm2(tmp_path):
    """The main job's program on the real model, one short epoch: the rewards see real text
    (the reference hands this tokenizer's completions to the reward as '', bug B1)."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "length_ratio.py"),
            "--epochs",
            "1",
            "--max-new-tokens",
            "16",
            "--eval-repeats",
            "1",
            "--output-dir",
            str(tmp_path / "run"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r["turn_1/reward_mean"] for r in rows if "turn_1/reward_mean" in r]
    assert len(train) == 4 and all(0.0 < r <= 1.0 for r in train)  # 8 items, 2 per round
    assert json.loads((tmp_path / "eval-metrics.json").read_text())["eval/turn_1/reward_mean"] > 0
