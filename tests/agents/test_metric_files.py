"""The metric files through stable-baselines3's logger: a resume keeps the earlier rows (SB3's
writers truncate on open), and new CSV columns keep their first-seen order (SB3 adds them in
set order)."""

from __future__ import annotations

import csv
import json

from cmlrl_agents.runs.logging import MetricsLogger


def _csv(path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_a_resume_keeps_the_rows_before_the_checkpoint_and_appends_after_them(tmp_path) -> None:
    first = MetricsLogger(tmp_path, logging_steps=0)
    first.log_train({"turn_1/reward_mean": 0.5}, step=2)
    first.log_train({"turn_1/reward_mean": 0.25}, step=4)
    saved = json.loads(json.dumps(first.state_dict()))
    first.close()

    resumed = MetricsLogger(tmp_path, logging_steps=0, write_config=False)
    resumed.load_state_dict(saved)
    resumed.log_train({"turn_1/reward_mean": 1.0, "turn_2/reward_mean": 0.75}, step=6)
    resumed.close()

    assert _csv(tmp_path / "metrics.csv") == [
        ["env_step", "turn_1/reward_mean", "turn_2/reward_mean"],
        ["2", "0.5", ""],
        ["4", "0.25", ""],
        ["6", "1.0", "0.75"],
    ]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"env_step": 2, "turn_1/reward_mean": 0.5},
        {"env_step": 4, "turn_1/reward_mean": 0.25},
        {"env_step": 6, "turn_1/reward_mean": 1.0, "turn_2/reward_mean": 0.75},
    ]
    assert list(tmp_path.glob("metrics.1.*")) == []  # nothing moved aside: the same run


def test_new_columns_keep_the_order_the_keys_came_in(tmp_path) -> None:
    keys = [f"turn_{k}/reward_mean" for k in range(12, 0, -1)]  # not sorted, not hash order
    with MetricsLogger(tmp_path, logging_steps=0) as logger:
        logger.log_train({"a": 1.0}, step=1)
        logger.log_train({key: 0.5 for key in keys}, step=2)
    header, first, second = _csv(tmp_path / "metrics.csv")
    assert header == ["env_step", "a", *keys]
    assert first == ["1", "1.0", *[""] * 12]
    assert second == ["2", "", *["0.5"] * 12]


def test_an_emission_is_the_mean_of_its_entries(tmp_path) -> None:
    with MetricsLogger(tmp_path, logging_steps=4) as logger:
        logger.log_train({"r": 1.0, "only_once": 3.0}, step=1)
        logger.log_train({"r": 2.0}, step=2)
        logger.log_train({"r": 6.0}, step=4)
    assert logger.history == [(4, {"r": 3.0, "only_once": 3.0})]
