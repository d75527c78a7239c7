"""MetricsLogger: aggregation over logging_steps, local files, resume, TensorBoard, W&B offline."""

from __future__ import annotations

import csv
import json
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cmlrl_agents.runs.logging import WANDB_CONFIG_KEYS, MetricsLogger, ProgressBar


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def as_rows(history: list[tuple[int, dict]]) -> list[dict]:
    return [{"env_step": step, **metrics} for step, metrics in history]


# ---- aggregation ----------------------------------------------------------------------------


def test_train_entries_are_averaged_per_key_and_emitted_at_the_triggering_step():
    logger = MetricsLogger(None, logging_steps=4)
    logger.log_train({"a": 1.0}, step=2)
    logger.log_train({"a": 2.0, "b": 10.0}, step=3)
    assert logger.history == []
    logger.log_train({"a": 6.0}, step=4)
    assert logger.history == [(4, {"a": 3.0, "b": 10.0})]
    logger.log_train({"a": 1.0}, step=6)
    logger.log_train({"a": 3.0}, step=8)
    assert logger.history[-1] == (8, {"a": 2.0})
    assert logger.last_logged_step == 8
    logger.log_train({"a": 5.0}, step=9)
    assert len(logger.history) == 2
    logger.flush()
    assert logger.history[-1] == (9, {"a": 5.0})
    logger.flush()  # nothing pending: no empty entry
    assert len(logger.history) == 3


def test_logging_steps_zero_emits_every_entry():
    logger = MetricsLogger(None, logging_steps=0)
    for step in (1, 1, 2):
        logger.log_train({"r": float(step)}, step=step)
    assert logger.history == [(1, {"r": 1.0}), (1, {"r": 1.0}), (2, {"r": 2.0})]


def test_eval_is_emitted_at_once_and_not_mixed_into_training_means(tmp_path):
    logger = MetricsLogger(tmp_path, logging_steps=100)
    logger.log_train({"turn_1/reward_mean": 0.5}, step=3)
    logger.log_eval({"eval/turn_1/reward_mean": 0.25, "eval/turn_1/expected_return": 1}, step=3)
    assert logger.history == [
        (3, {"eval/turn_1/reward_mean": 0.25, "eval/turn_1/expected_return": 1.0})
    ]
    saved = json.loads((tmp_path / "eval-metrics.json").read_text())
    assert saved == {
        "env_step": 3,
        "eval/turn_1/reward_mean": 0.25,
        "eval/turn_1/expected_return": 1.0,
    }
    logger.log_eval({"eval/turn_1/reward_mean": 0.75}, step=5)
    saved = json.loads((tmp_path / "eval-metrics.json").read_text())
    assert saved == {"env_step": 5, "eval/turn_1/reward_mean": 0.75}
    logger.close()
    # close flushes the pending entry at the current env_step, after the evaluation at step 5
    assert logger.history[-1] == (5, {"turn_1/reward_mean": 0.5})


# ---- local files ----------------------------------------------------------------------------


def test_jsonl_and_csv_hold_every_emitted_entry_and_the_csv_header_grows(tmp_path):
    logger = MetricsLogger(tmp_path, logging_steps=1, run_config={"lr": 1e-5})
    logger.log_train({"turn_1/reward_mean": 0.5}, step=1)
    logger.log_train({"turn_1/reward_mean": 0.7}, step=2)
    logger.log_train({"turn_1/reward_mean": 0.1, "turn_2/reward_mean": 0.9}, step=3)
    logger.log_eval({"eval/turn_1/reward_mean": 0.3}, step=3)
    logger.log_train({"turn_1/reward_mean": 0.2}, step=4)
    logger.close()
    expected = as_rows(logger.history)
    assert read_jsonl(tmp_path / "metrics.jsonl") == expected
    rows = read_csv(tmp_path / "metrics.csv")
    header = ["env_step", "turn_1/reward_mean", "turn_2/reward_mean", "eval/turn_1/reward_mean"]
    assert list(rows[0]) == header
    assert [int(r["env_step"]) for r in rows] == [1, 2, 3, 3, 4]
    assert rows[0]["turn_2/reward_mean"] == ""
    assert float(rows[2]["turn_2/reward_mean"]) == 0.9
    assert float(rows[4]["turn_1/reward_mean"]) == 0.2
    assert json.loads((tmp_path / "config.json").read_text()) == {"lr": 1e-5}


def _log_sequence(logger: MetricsLogger, steps: range) -> None:
    for step in steps:
        logger.log_train({"turn_1/reward_mean": step / 10, f"k{step % 3}": 1.0}, step=step)
        if step % 5 == 0:
            logger.log_eval({"eval/turn_1/reward_mean": step / 20}, step=step)


def test_resume_continues_the_files_without_loss_or_duplicates(tmp_path):
    reference = MetricsLogger(tmp_path / "reference", logging_steps=3)
    _log_sequence(reference, range(1, 21))
    reference.close()

    run = tmp_path / "run"
    first = MetricsLogger(run, logging_steps=3)
    _log_sequence(first, range(1, 12))
    saved = json.loads(json.dumps(first.state_dict()))  # as it travels in trainer_state.json
    assert saved["pending"], "the checkpoint must carry a pending entry for this test"
    _log_sequence(first, range(12, 15))  # logged after the checkpoint, then the process dies

    resumed = MetricsLogger(run, logging_steps=3)
    resumed.load_state_dict(saved)
    _log_sequence(resumed, range(12, 21))
    resumed.close()

    assert resumed.history == reference.history
    assert read_jsonl(run / "metrics.jsonl") == read_jsonl(tmp_path / "reference" / "metrics.jsonl")
    assert read_csv(run / "metrics.csv") == read_csv(tmp_path / "reference" / "metrics.csv")
    assert sorted(p.name for p in run.glob("metrics*")) == ["metrics.csv", "metrics.jsonl"]


def test_a_fresh_logger_moves_an_earlier_runs_files_aside(tmp_path):
    for value in (1.0, 2.0):
        logger = MetricsLogger(tmp_path, logging_steps=1)
        logger.log_train({"r": value}, step=1)
        logger.close()
    assert read_jsonl(tmp_path / "metrics.1.jsonl") == [{"env_step": 1, "r": 1.0}]
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"env_step": 1, "r": 2.0}]
    assert read_csv(tmp_path / "metrics.1.csv") == [{"env_step": "1", "r": "1.0"}]


def test_load_state_dict_after_logging_is_refused():
    logger = MetricsLogger(None, logging_steps=1)
    logger.log_train({"r": 1.0}, step=1)
    with pytest.raises(RuntimeError, match="fresh logger"):
        logger.load_state_dict(MetricsLogger(None, logging_steps=1).state_dict())


def test_secrets_are_removed_from_config_json(tmp_path):
    run_config = {
        "max_new_tokens": 64,
        "pad_token": "<pad>",
        "pad_token_id": 2,
        "hf_token": "hf_abc",
        "reward": {"comparator_api_key": "sk-1", "model": "m"},
    }
    sections = {"output": {"verbose": False}, "service": {"password": "p", "client_secret": "s"}}
    MetricsLogger(
        tmp_path,
        logging_steps=1,
        run_config=run_config,
        wandb_config={"project": "p", "config_sections": sections},
    )
    text = (tmp_path / "config.json").read_text()
    assert "hf_abc" not in text and "sk-1" not in text and '"p"' not in text
    assert json.loads(text) == {
        "max_new_tokens": 64,
        "pad_token": "<pad>",
        "pad_token_id": 2,
        "reward": {"model": "m"},
        "output": {"verbose": False},
        "service": {},
    }


def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = MetricsLogger(tmp_path, logging_steps=1)
    logger.log_train({"turn_1/reward_mean": 0.5}, step=2)
    logger.log_eval({"eval/turn_1/reward_mean": 0.25}, step=2)
    logger.log_train({"turn_1/reward_mean": 0.75}, step=4)
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    train = [(e.step, e.value) for e in events.Scalars("turn_1/reward_mean")]
    assert train == [(2, 0.5), (4, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("eval/turn_1/reward_mean")] == [(2, 0.25)]


def resume_after_step_3(run: Path, crashed: Any, redone: Any) -> None:
    """Log r = 1, 2, 3 and checkpoint; ``crashed(logger)`` logs what the crash then loses;
    a new logger resumes from the checkpoint and ``redone(logger)`` logs on."""
    first = MetricsLogger(run, logging_steps=1)
    for step in (1, 2, 3):
        first.log_train({"r": float(step)}, step=step)
    saved = first.state_dict()
    crashed(first)
    first.close()
    resumed = MetricsLogger(run, logging_steps=1)
    resumed.load_state_dict(saved)
    redone(resumed)
    resumed.close()


def scalars(run: Path, tag: str) -> list[tuple[int, float]]:
    """``(step, value)`` of every TensorBoard point of ``tag`` in the run folder, in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_after_resume_shows_each_step_once(tmp_path):
    pytest.importorskip("tensorboard")

    def redone(logger: MetricsLogger) -> None:
        for step in (4, 5):
            logger.log_train({"r": float(step)}, step=step)

    resume_after_step_3(tmp_path, lambda logger: logger.log_train({"r": -4.0}, step=4), redone)
    assert scalars(tmp_path, "r") == [(s, float(s)) for s in range(1, 6)]


def test_tensorboard_after_resume_shows_an_entry_at_the_checkpoints_step_once(tmp_path):
    # A checkpoint is taken after its round's entry at step 3, and the next round's evaluation
    # logs at step 3 too: a crash after it must not leave that evaluation beside the redone one.
    pytest.importorskip("tensorboard")

    def redone(logger: MetricsLogger) -> None:
        logger.log_eval({"eval/r": 3.0}, step=3)
        logger.log_train({"r": 4.0}, step=4)

    resume_after_step_3(tmp_path, lambda logger: logger.log_eval({"eval/r": -3.0}, step=3), redone)
    assert scalars(tmp_path, "r") == [(s, float(s)) for s in range(1, 5)]
    assert scalars(tmp_path, "eval/r") == [(3, 3.0)]


# ---- input checks ---------------------------------------------------------------------------


def test_bad_input_is_rejected_with_a_clear_message():
    with pytest.raises(ValueError, match="logging_steps must be an int >= 0"):
        MetricsLogger(None, logging_steps=-1)
    logger = MetricsLogger(None, logging_steps=1)
    with pytest.raises(TypeError, match="'r' = 'high' is not a number"):
        logger.log_train({"r": "high"}, step=1)
    with pytest.raises(TypeError, match="'r' = '0.5' is not a number"):
        logger.log_train({"r": "0.5"}, step=1)
    logger.log_train({"r": torch.tensor(0.5), "n": np.float32(2.0)}, step=np.int64(1))
    assert logger.history == [(1, {"r": 0.5, "n": 2.0})]
    assert type(logger.history[0][0]) is int
    logger.log_train({"r": 1.0}, step=5)
    with pytest.raises(ValueError, match="step=4 is lower than the previous step 5"):
        logger.log_eval({"eval/r": 1.0}, step=4)
    with pytest.raises(ValueError, match="step must be an int >= 0"):
        logger.log_train({"r": 1.0}, step=-1)
    logger.close()
    with pytest.raises(RuntimeError, match="after MetricsLogger.close"):
        logger.log_train({"r": 1.0}, step=6)


def test_unknown_wandb_key_is_rejected_naming_the_valid_keys():
    with pytest.raises(ValueError) as error:
        MetricsLogger(None, logging_steps=1, wandb_config={"project": "p", "projct": "q"})
    message = str(error.value)
    assert "projct" in message
    assert all(key in message for key in WANDB_CONFIG_KEYS)
    with pytest.raises(ValueError, match="aliases"):
        MetricsLogger(None, logging_steps=1, wandb_config={"name": "a", "run_name": "b"})
    with pytest.raises(ValueError, match="list of strings"):
        MetricsLogger(None, logging_steps=1, wandb_config={"tags": "one"})


def test_verbose_comes_from_the_argument_then_config_sections_then_the_tty():
    quiet = {"config_sections": {"output": {"verbose": False}}}
    loud = {"config_sections": {"output": {"verbose": True}}}
    assert MetricsLogger(None, logging_steps=1, wandb_config=quiet).verbose is False
    assert MetricsLogger(None, logging_steps=1, wandb_config=loud).verbose is True
    assert MetricsLogger(None, logging_steps=1, wandb_config=quiet, verbose=True).verbose is True
    expected = True if sys.stdout.isatty() else "lines"  # a bar, or progress lines in a log
    assert MetricsLogger(None, logging_steps=1).verbose == expected


def test_wandb_is_not_imported_without_wandb_config(tmp_path):
    code = (
        "import sys\n"
        "from cmlrl_agents.runs.logging import MetricsLogger\n"
        f"logger = MetricsLogger({str(tmp_path)!r}, logging_steps=1)\n"
        "logger.log_train({'r': 1.0}, step=1)\n"
        "logger.close()\n"
        "assert 'wandb' not in sys.modules, 'wandb was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_progress_lines_come_after_the_first_round_then_at_most_once_a_minute(capsys):
    now = [0.0]
    bar = ProgressBar(8, verbose="lines", desc="magrpo", clock=lambda: now[0])
    bar.update(0)  # the trainers' first call: the items already done
    for seconds, reward in ((90, 0.41234), (120, 0.5), (180, 0.6), (200, 0.7)):
        now[0] = seconds
        bar.update(2, postfix={"turn_1": reward})
    bar.close()
    captured = capsys.readouterr()
    assert captured.err == ""  # no bar
    assert captured.out.splitlines() == [
        # 2 items in 90 s: 45 s an item, 6 left
        "magrpo: 2/8 items (25%) in 1.5 min, about 4.5 min left; turn_1=0.4123",
        # 120 s: only 30 s after the last line; 180 s: 6 items in 180 s, 2 left
        "magrpo: 6/8 items (75%) in 3.0 min, about 1.0 min left; turn_1=0.6",
        "magrpo: 8/8 items (100%) in 3.3 min; turn_1=0.7",  # at close
    ]


def test_the_last_progress_line_is_not_printed_twice(capsys):
    now = [0.0]
    bar = ProgressBar(4, verbose="lines", desc="magrpo", clock=lambda: now[0])
    bar.update(0)
    now[0] = 100.0
    bar.update(4)  # the end, shown at once
    now[0] = 101.0
    bar.close()
    assert capsys.readouterr().out == "magrpo: 4/4 items (100%) in 1.7 min\n"


def test_progress_lines_estimate_a_resumed_run_from_its_own_pace(capsys):
    now = [0.0]
    bar = ProgressBar(10, verbose="lines", desc="magrpo", clock=lambda: now[0])
    bar.update(6)  # resumed after 6 items
    now[0] = 30.0
    bar.update(2, postfix={})
    assert capsys.readouterr().out == "magrpo: 8/10 items (80%) in 30 s, about 30 s left\n"


def test_progress_bar_is_silent_unless_verbose(capsys):
    with ProgressBar(3, verbose=False, desc="train") as bar:
        bar.update(1, postfix={"reward": 0.5})
    assert capsys.readouterr().err == ""
    with ProgressBar(3, verbose=True, desc="train") as bar:
        bar.update(2, postfix={"reward": 0.123456})
    err = capsys.readouterr().err
    assert "train" in err and "2/3" in err and "reward=0.1235" in err


# ---- W&B (offline) --------------------------------------------------------------------------


def _wandb_history(records: list) -> list[dict]:
    """The logged entries of an offline run: ``{"step": n, key: value, ...}`` in order."""
    history = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            items = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            entry = {k: v for k, v in items.items() if not k.startswith("_")}
            history.append({"step": record.history.step.num, **entry})
    return history


def _wandb_records(run_file: Path) -> list:
    """Records of an offline run file (LevelDB-style log: 32 KiB blocks, 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    records, position, chunks = [], 7, b""
    while position + 7 <= len(data):
        left = 32768 - position % 32768
        if left < 7:
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if position + 7 + length > len(data):  # still being written
            break
        chunks += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def test_wandb_offline_run_gets_config_metrics_and_is_finished_only_by_close(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_config = {
        "project": "cmlrl-test",
        "run_name": "unit",
        "tags": ["a", "b"],
        "dir": str(tmp_path / "wb"),
        "config_sections": {"dataset": {"name": "toy"}, "output": {"verbose": False}},
    }
    run_config = {"num_agents": 2, "api_key": "secret-value"}
    logger = MetricsLogger(
        tmp_path / "out", logging_steps=4, wandb_config=wandb_config, run_config=run_config
    )
    logger.log_eval({"eval/turn_1/reward_mean": 0.1}, step=0)
    logger.log_train({"turn_1/reward_mean": 0.2}, step=2)
    logger.log_train({"turn_1/reward_mean": 0.4}, step=4)
    logger.log_train({"turn_1/reward_mean": 1.0}, step=6)
    logger.flush()  # end of training: must not end the run (B17)
    logger.log_eval({"eval/turn_1/reward_mean": 0.9}, step=6)
    logger.close()

    run_files = list((tmp_path / "wb").glob("wandb/offline-run-*/run-*.wandb"))
    assert len(run_files) == 1
    # wandb-core writes the offline file in its own process: finish() can return before the
    # last records reach the disk, so wait for the exit record.
    deadline = time.monotonic() + 60
    while True:
        records = _wandb_records(run_files[0])
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.display_name == "unit" and list(run.tags) == ["a", "b"]
    assert run.project == "cmlrl-test"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["num_agents"] == 2
    assert config["dataset"] == {"name": "toy"} and config["output"] == {"verbose": False}
    assert "api_key" not in config
    history = _wandb_history(records)
    assert history == [
        {"step": 0, "eval/turn_1/reward_mean": 0.1},
        {"step": 4, "turn_1/reward_mean": pytest.approx(0.3)},
        {"step": 6, "turn_1/reward_mean": 1.0, "eval/turn_1/reward_mean": 0.9},
    ]
    assert kinds.count("exit") == 1 and kinds[-1] == "exit"


def test_a_resumed_logger_continues_the_same_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb_config = {"project": "cmlrl-test", "dir": str(tmp_path / "wb")}
    first = MetricsLogger(None, logging_steps=1, wandb_config=wandb_config)
    first.log_train({"r": 1.0}, step=1)
    saved = first.state_dict()
    first.close()
    resumed = MetricsLogger(None, logging_steps=1, wandb_config=wandb_config)
    resumed.load_state_dict(saved)
    resumed.log_train({"r": 2.0}, step=2)
    resumed.close()
    runs = sorted((tmp_path / "wb" / "wandb").glob("offline-run-*"))
    # One folder per segment (wandb adds "-1" when both start within the same second).
    assert saved["wandb_run_id"] and len(runs) == 2
    assert all(f"-{saved['wandb_run_id']}" in run.name for run in runs)


def test_the_wandb_run_id_is_chosen_before_the_first_entry_so_a_resume_reopens_it():
    # A checkpoint written before W&B opened its run (nothing emitted yet) must still name it.
    config = {"project": "p", "mode": "offline"}
    first = MetricsLogger(None, logging_steps=50, wandb_config=config)
    state = first.state_dict()
    assert re.fullmatch(r"[0-9a-f]{8}", state["wandb_run_id"])
    resumed = MetricsLogger(None, logging_steps=50, wandb_config=config)
    assert resumed.state_dict()["wandb_run_id"] != state["wandb_run_id"]  # a new run's own
    resumed.load_state_dict(state)
    assert resumed.state_dict()["wandb_run_id"] == state["wandb_run_id"]
    named = MetricsLogger(None, logging_steps=1, wandb_config={**config, "id": "run-7"})
    assert named.state_dict()["wandb_run_id"] == "run-7"
    assert MetricsLogger(None, logging_steps=1).state_dict()["wandb_run_id"] is None
