"""Experiment tooling through a real trainer on tiny models (issue #5): W&B offline, local files,
progress output, checkpoints, save_model and secrets."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from test_logging import _wandb_history, _wandb_records  # offline-run readers
from transformers import AutoModelForCausalLM, AutoTokenizer

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.testing import tiny_agent
from cmlrl_env import tasks

SECRET = "sk-test-SECRET-0123456789"
TRAIN_KEYS = {
    *("turn_1/reward_mean", "turn_1/expected_return", "loss", "grad_norm"),
    *(f"agent_{a}/{k}" for a in (0, 1) for k in ("loss", "grad_norm", "turn_1/expected_return")),
    *(f"agent_{a}/entropy" for a in (0, 1)),
    *(f"agent_{a}/completions/{k}" for a in (0, 1) for k in ("length_mean", "clipped_fraction")),
    *(f"completions/{k}" for k in ("length_mean", "length_min", "length_max", "clipped_fraction")),
    "groups/zero_spread_fraction",
}
EVAL_KEYS = {"eval/turn_1/reward_mean", "eval/turn_1/expected_return", "eval/turn_1/reward_sem"}
LOCAL_FILES = ("config.json", "metrics.csv", "metrics.jsonl", "eval-metrics.json", "rewards.png")


def make_trainer(tmp_path: Path, *, wandb_config: dict | None = None, **config) -> MAGRPOTrainer:
    """4 training items, G=2 aligned (2 env_steps per item), 2 items per round, eval every 2."""
    data = tasks.length_ratio_dataset()
    defaults = dict(
        num_agents=2,
        num_generations=2,
        max_new_tokens=5,
        rollout_buffer_size=2,
        eval_interval=2,
        eval_num_samples=2,
        eval_batch_size=2,
        logging_steps=1,
        agent_learning_rate=1e-3,
        seed=0,
        output_dir=str(tmp_path / "run"),
    )
    return MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=data.select(range(4)),
        eval_dataset=data.select(range(8, 10)),
        args=MAGRPOConfig(**{**defaults, **config}),
        wandb_config=wandb_config,
    )


def finished_run_records(wandb_dir: Path) -> list:
    """Records of the one offline run under ``wandb_dir``, once its exit record is on disk."""
    run_files = list(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1, run_files
    # wandb-core writes the file in its own process; finish() may return before the last record.
    deadline = time.monotonic() + 60
    while True:
        records = _wandb_records(run_files[0])
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, "the offline W&B run never got its exit record"
        time.sleep(0.2)


def by_step(history: list[tuple[int, dict]]) -> list[dict]:
    merged: dict[int, dict] = defaultdict(dict)
    for step, metrics in history:
        merged[step].update(metrics)
    return [{"step": step, **metrics} for step, metrics in sorted(merged.items())]


def assert_local_files(run: Path, trainer: MAGRPOTrainer) -> None:
    for name in LOCAL_FILES:
        assert (run / name).is_file(), (
            f"{name} missing from {sorted(p.name for p in run.iterdir())}"
        )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"env_step": s, **m} for s, m in trainer.logger.history]
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert header[0] == "env_step" and TRAIN_KEYS | EVAL_KEYS <= set(header)
    last_eval = next(
        m | {"env_step": s} for s, m in reversed(trainer.logger.history) if EVAL_KEYS <= set(m)
    )
    assert json.loads((run / "eval-metrics.json").read_text()) == last_eval
    assert (run / "rewards.png").read_bytes()[:4] == b"\x89PNG"


def test_wandb_offline_run_gets_the_settings_and_the_documented_metrics(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sections = {
        "dataset": {"name": "length_ratio", "train_items": 4},
        "output": {"verbose": False},
        "service": {"api_key": SECRET, "region": "eu"},
    }
    wandb_config = {
        "project": "cmlrl-test",
        "name": "issue-5",
        "tags": ["tiny"],
        "dir": str(tmp_path / "wb"),
        "config_sections": sections,
    }
    trainer = make_trainer(tmp_path, wandb_config=wandb_config, save_steps=2)
    trainer.train()
    trainer.save_model(tmp_path / "model")  # must not end the W&B run (B17)
    trainer.evaluate()  # ... so this lands in the same run, at the final env_step
    trainer.close()

    records = finished_run_records(tmp_path / "wb")
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds.count("exit") == 1 and kinds[-1] == "exit"
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert (run.project, run.display_name, list(run.tags)) == ("cmlrl-test", "issue-5", ["tiny"])
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["algorithm"] == "magrpo" and config["num_agents"] == 2
    assert config["num_generations"] == 2 and config["agent_learning_rate"] == 1e-3
    assert config["max_new_tokens"] == 5 and config["save_steps"] == 2
    assert config["dataset"] == sections["dataset"] and config["output"] == sections["output"]
    assert config["service"] == {"region": "eu"}

    # SPEC §7: training entries at env_step (2 items x 2 joint actions per round), evaluations
    # before items 0 and 2 (env_step 0 and 4) and the manual one after save_model (8).
    history = _wandb_history(records)
    assert [h["step"] for h in history] == [0, 4, 8]
    assert set(history[0]) - {"step"} == EVAL_KEYS
    assert set(history[1]) - {"step"} == set(history[2]) - {"step"} == TRAIN_KEYS | EVAL_KEYS
    # one approx per entry: pytest.approx compares no nested structures (pytest >= 9.1 says so)
    expected = by_step(trainer.logger.history)
    assert len(history) == len(expected)
    for got, want in zip(history, expected, strict=True):
        assert got == pytest.approx(want), got["step"]
    assert_local_files(tmp_path / "run", trainer)
    for path in [*(tmp_path / "wb").rglob("*"), *(tmp_path / "run").rglob("*")]:
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


def test_save_model_writes_folders_that_transformers_loads(tmp_path):
    trainer = make_trainer(tmp_path, eval_interval=0)
    trainer.train()
    trainer.save_model(tmp_path / "model")
    trainer.close()
    for i, agent in enumerate(trainer.agents):
        folder = tmp_path / "model" / f"agent_{i}"
        model = AutoModelForCausalLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        saved = agent.model.state_dict()
        assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
        text = "Describe a city in the clouds. <|im_end|>"
        assert tokenizer(text)["input_ids"] == agent.tokenizer(text)["input_ids"]
        assert tokenizer.eos_token == agent.tokenizer.eos_token
    # the two agents trained apart: their saved weights differ
    a, b = (tmp_path / "model" / f"agent_{i}" / "model.safetensors" for i in (0, 1))
    assert a.read_bytes() != b.read_bytes()


def test_local_files_without_wandb(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.train()
    trainer.close()
    assert trainer.logger._wandb_cfg is None
    assert_local_files(tmp_path / "run", trainer)
    assert not list(tmp_path.rglob("wandb"))


@pytest.mark.parametrize(
    ("verbose", "wandb_config", "shown"),
    [
        (False, None, False),
        (None, {"mode": "disabled", "config_sections": {"output": {"verbose": False}}}, False),
        (None, {"mode": "disabled", "config_sections": {"output": {"verbose": True}}}, True),
        (True, None, True),
    ],
)
def test_progress_bar_follows_verbose_and_shows_the_latest_reward(
    tmp_path, capsys, verbose, wandb_config, shown
):
    trainer = make_trainer(tmp_path, verbose=verbose, wandb_config=wandb_config, eval_interval=0)
    trainer.train()
    trainer.close()
    err = capsys.readouterr().err
    if not shown:
        assert "magrpo" not in err and "%|" not in err, err
        return
    last = next(m for _, m in reversed(trainer.logger.history) if "turn_1/reward_mean" in m)
    final_line = err.replace("\r", "\n").strip().splitlines()[-1]
    assert final_line.startswith("magrpo: 100%") and "4/4" in final_line
    assert f"turn_1={last['turn_1/reward_mean']:.4g}" in final_line


@pytest.mark.parametrize(
    ("save_steps", "limit", "kept"),
    [(1, 2, ["checkpoint-3", "checkpoint-4"]), (2, None, ["checkpoint-2", "checkpoint-4"])],
)
def test_checkpoints_every_save_steps_items_keep_the_newest(tmp_path, save_steps, limit, kept):
    trainer = make_trainer(
        tmp_path,
        rollout_buffer_size=1,
        eval_interval=0,
        save_steps=save_steps,
        save_total_limit=limit,
    )
    trainer.train()
    trainer.close()
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == kept
    for name in kept:
        state = json.loads((root / name / "trainer_state.json").read_text())["trainer_state"]
        assert state["items_seen"] == int(name.split("-")[1])


def test_no_secrets_reach_checkpoints_or_config_json(tmp_path):
    sections = {
        "service": {"api_key": SECRET, "hf_token": SECRET, "password": SECRET, "url": "x"},
        "output": {"verbose": False},
    }
    wandb_config = {"mode": "disabled", "config_sections": sections}
    trainer = make_trainer(tmp_path, wandb_config=wandb_config, save_steps=2, eval_interval=0)
    trainer.train()
    trainer.close()
    run = tmp_path / "run"
    config = json.loads((run / "config.json").read_text())
    assert config["service"] == {"url": "x"} and config["max_new_tokens"] == 5
    files = [p for p in run.rglob("*") if p.is_file()]
    assert any(p.name == "trainer_state.json" for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), path
