"""examples/preference.py and examples/model_reward.py run end to end on tiny models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_example(tmp_path: Path, name: str, *args: str) -> str:
    command = [sys.executable, str(ROOT / "examples" / name), "--tiny", *args]
    command += ["--max-new-tokens", "4", "--output-dir", str(tmp_path / "out")]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_preference_example_runs_madpo_and_marlhf(tmp_path):
    out = run_example(tmp_path, "preference.py", "--eval-repeats", "1", "--iterations", "2")
    assert "MADPO eval/turn_1/reward_mean: before" in out
    assert "MARLHF eval/turn_1/reward_mean: before" in out
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert set(results) == {"madpo", "marlhf"}
    assert 0.0 <= results["madpo"]["after"] <= 1.0  # the task reward, not a learned one
    assert (tmp_path / "out" / "madpo" / "preference" / "pairs-001.jsonl").exists()
    assert (tmp_path / "out" / "marlhf" / "reward_model" / "model.pt").exists()


def test_model_reward_example_leaves_the_reward_model_unchanged(tmp_path):
    out = run_example(tmp_path, "model_reward.py")
    assert "reward model held-out pair accuracy:" in out
    assert "reward model unchanged by training: True; device: cpu" in out
    assert (tmp_path / "out" / "reward-model" / "config.json").exists()
