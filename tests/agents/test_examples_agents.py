"""The main job's example runs end to end on a tiny model and, as a slow test, on SmolLM2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_length_ratio(tmp_path: Path, *args: str, timeout: int) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        str(ROOT / "examples" / "length_ratio.py"),
        "--epochs",
        "1",
        "--eval-repeats",
        "1",
        "--output-dir",
        str(tmp_path / "run"),
        *args,
    ]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_length_ratio_example_runs_on_a_tiny_model(tmp_path):
    proc = run_length_ratio(tmp_path, "--tiny", "--max-new-tokens", "4", timeout=300)
    assert "eval/turn_1/reward_mean: before" in proc.stdout
    metrics = json.loads((tmp_path / "eval-metrics.json").read_text())
    assert set(metrics) == {
        *("eval/turn_1/reward_mean", "eval/turn_1/expected_return", "eval/turn_1/reward_sem")
    }
    assert (tmp_path / "run" / "rewards.png").stat().st_size > 0
    assert (tmp_path / "run" / "metrics.jsonl").exists()


def test_length_ratio_example_adds_kl_to_the_initial_model_when_asked(tmp_path):
    run_length_ratio(tmp_path, "--tiny", "--max-new-tokens", "4", "--reference-kl", timeout=300)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["reference_kl_enabled"] is True
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert any("turn_1/reference_kl_mean" in json.loads(line) for line in lines)


def test_length_ratio_example_sets_adamws_momentum_when_asked(tmp_path):
    args = ("--tiny", "--max-new-tokens", "4", "--adam-beta1", "0.5")
    run_length_ratio(tmp_path, *args, timeout=300)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["adam_beta1"] == 0.5


@pytest.mark.slow
def test_length_ratio_example_with_smollm2(tmp_path):
    """The main job's program on the real model, one short epoch: the rewards see real text
    (the reference hands this tokenizer's completions to the reward as '', bug B1)."""
    run_length_ratio(tmp_path, "--max-new-tokens", "16", timeout=1200)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    train = [
        row["turn_1/reward_mean"] for row in map(json.loads, lines) if "turn_1/reward_mean" in row
    ]
    assert len(train) == 4 and all(0.0 < r <= 1.0 for r in train)  # 8 items, 2 per round
    assert json.loads((tmp_path / "eval-metrics.json").read_text())["eval/turn_1/reward_mean"] > 0
