"""`cmlrl check` and a tiny-model `cmlrl train` on each of the paper's run files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cmlrl_agents.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
RUN_FILES = [
    "humaneval.yaml",
    "humaneval_centralized.yaml",
    "humaneval_single.yaml",
    "writing.yaml",
]


@pytest.mark.parametrize("run_file", RUN_FILES)
def test_check_passes_on_each_run_file(run_file, capsys) -> None:
    assert main(["check", str(CONFIGS / run_file)]) == 0
    out = capsys.readouterr().out
    assert "OK: the task passes every check." in out


@pytest.mark.parametrize(
    ("run_file", "eval_keys"),
    [
        ("humaneval.yaml", ["eval/turn_1/pass@1", "eval/turn_2/level/tests"]),
        ("humaneval_centralized.yaml", ["eval/turn_1/pass@1", "eval/parse_rate"]),
        ("humaneval_single.yaml", ["eval/turn_1/pass@1", "eval/turn_1/level/uses_aux"]),
        ("writing.yaml", ["eval/turn_1/reward_mean"]),
    ],
)
def test_a_tiny_model_trains_on_each_run_file(run_file, eval_keys, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    overrides = {
        "model": "tiny",
        "task.max_train_items": 2,
        "task.max_eval_items": 1,
        "config.max_new_tokens": 4,
        "config.rollout_buffer_size": 2,
        "config.output_dir": str(run_dir),
        "config.verbose": False,
    }
    argv = ["train", str(CONFIGS / run_file), "--no-save-model"]
    for key, value in overrides.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss" in r]
    assert train_rows and all(isinstance(r["loss"], float) for r in train_rows)
    final = json.loads((run_dir / "eval-metrics.json").read_text())
    for key in eval_keys:
        assert key in final, key
