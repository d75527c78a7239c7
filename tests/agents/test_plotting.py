"""plot_metrics: a reward PNG from metrics.jsonl, with and without evaluation entries."""

from __future__ import annotations

import matplotlib
import pytest

from cmlrl_agents.runs.logging import MetricsLogger
from cmlrl_agents.runs.plotting import plot_metrics

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
