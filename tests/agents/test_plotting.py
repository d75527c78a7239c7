"""plot_metrics: a reward PNG from metrics.jsonl, with and without evaluation entries."""

from __future__ import annotations

import matplotlib
import pytest

from cmlrl_agents.runs import evaluation
from cmlrl_agents.runs.logging import MetricsLogger
from cmlrl_agents.runs.plotting import _read_series, plot_metrics, reward_figure

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_run(run_dir, *, with_eval: bool) -> None:
    logger = MetricsLogger(run_dir, logging_steps=1)
    for step in range(1, 9):
        metrics = {"turn_1/reward_mean": step / 10, "turn_1/expected_return": step / 5}
        if step % 2 == 0:
            metrics["turn_2/reward_mean"] = step / 8
        logger.log_train(metrics, step=step * 4)
        if with_eval and step % 4 == 0:
            logger.log_eval(
                {"eval/turn_1/reward_mean": 0.5, "eval/turn_2/reward_mean": 0.6}, step * 4
            )
    logger.close()


@pytest.mark.parametrize("with_eval", [True, False])
def test_plot_writes_a_png_next_to_the_metrics(tmp_path, with_eval):
    backend = matplotlib.get_backend()
    write_run(tmp_path, with_eval=with_eval)
    path = plot_metrics(tmp_path)
    assert path == tmp_path / "rewards.png"
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 5000
    assert matplotlib.get_backend() == backend  # the pyplot backend is left alone


def test_plot_to_another_path_and_with_no_reward_keys(tmp_path):
    logger = MetricsLogger(tmp_path, logging_steps=1)
    logger.log_train({"loss": 1.0}, step=1)
    logger.close()
    path = plot_metrics(tmp_path, output=tmp_path / "empty.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_missing_or_broken_metrics_file_is_reported(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no metrics.jsonl"):
        plot_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(
        '{"env_step": 1, "turn_1/reward_mean": 0.5}\nnot json\n'
    )
    with pytest.raises(ValueError, match=r"metrics.jsonl:2 is not a metrics entry"):
        plot_metrics(tmp_path)


def test_a_run_with_one_training_point_shows_it(tmp_path):
    logger = MetricsLogger(tmp_path, logging_steps=1)
    logger.log_train({"turn_1/reward_mean": 0.4}, step=4)
    logger.close()
    train, evaluation, errors = _read_series(tmp_path / "metrics.jsonl")
    figure = reward_figure(train, evaluation, errors, "one point")
    (line,) = figure.axes[0].get_lines()
    assert list(line.get_xdata()) == [4] and list(line.get_ydata()) == [0.4]
    assert line.get_marker() == "o"  # a line through one point draws nothing without one


def test_eval_points_carry_their_standard_error(tmp_path):
    logger = MetricsLogger(tmp_path, logging_steps=1)
    logger.log_eval({"eval/turn_1/reward_mean": 0.5, "eval/turn_1/reward_sem": 0.2}, 0)
    logger.log_eval({"eval/turn_1/reward_mean": 0.7}, 8)  # one item: no standard error
    logger.close()
    train, evaluation, errors = _read_series(tmp_path / "metrics.jsonl")
    assert evaluation == {1: ([0, 8], [0.5, 0.7])} and errors == {1: [0.2, 0.0]}
    axes = reward_figure(train, evaluation, errors, "eval").axes[0]
    (bars,) = axes.containers
    (segments,) = bars.lines[2]  # the vertical error segments
    spans = [(round(a[1], 6), round(b[1], 6)) for a, b in segments.get_segments()]
    assert spans == [(0.3, 0.7), (0.7, 0.7)]
    assert axes.get_legend_handles_labels()[1] == ["eval turn 1 (±1 s.e.)"]


def test_eval_metrics_hold_the_standard_error_of_the_reward_mean(monkeypatch):
    # three items' turn-1 rewards 0.2, 0.4, 0.9: mean 0.5, sample std sqrt(0.26 / 2), s.e.
    # sqrt(0.13) / sqrt(3) = 0.208167
    values = {"turn_1/reward_mean": [0.2, 0.4, 0.9], "turn_1/expected_return": [1.0, 1.0, 1.0]}
    monkeypatch.setattr(evaluation, "eval_values", lambda tree, *args: values)
    metrics = evaluation.mean_eval_metrics([object()], None, 1, 1.0)
    assert metrics == pytest.approx(
        {
            "eval/turn_1/reward_mean": 0.5,
            "eval/turn_1/expected_return": 1.0,
            "eval/turn_1/reward_sem": 0.208167,
        },
        abs=1e-6,
    )
    monkeypatch.setattr(evaluation, "eval_values", lambda tree, *args: {"turn_1/reward_mean": [1]})
    assert evaluation.mean_eval_metrics([object()], None, 1, 1.0) == {"eval/turn_1/reward_mean": 1}
