"""A run whose output is not a terminal (a notebook, a log file) prints progress lines by
default instead of nothing."""

from __future__ import annotations

import io
import sys

from datasets import Dataset

from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.runs.logging import MetricsLogger
from cmlrl_agents.testing import tiny_agent


def test_train_prints_progress_and_eval_lines_without_a_terminal(tmp_path, capsys) -> None:
    args = MAGRPOConfig(
        num_agents=2,
        num_generations=2,
        max_new_tokens=4,
        rollout_buffer_size=2,
        eval_interval=2,
        eval_num_samples=1,
        output_dir=str(tmp_path / "run"),
    )
    data = Dataset.from_dict({"prompt": ["p0", "p1", "p2", "p3"]})
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        reward_func=lambda a, b: [float(len(x) < len(y)) for x, y in zip(a, b, strict=True)],
        train_dataset=data,
        eval_dataset=data.select(range(1)),
        args=args,
    )
    assert trainer.logger.verbose == "lines"  # pytest's captured stdout is not a terminal
    trainer.train()
    trainer.close()
    lines = capsys.readouterr().out.splitlines()
    progress = [line for line in lines if line.startswith("magrpo: ")]
    # after the first round (2 of 4 items), then once more at the end
    assert [line.split(" in ")[0] for line in progress] == [
        "magrpo: 2/4 items (50%)",
        "magrpo: 4/4 items (100%)",
    ]
    assert "left; turn_1=" in progress[0]
    assert sum(line.startswith("eval @ env_step") for line in lines) == 2  # before 0 and 2


class RecordingStream(io.StringIO):
    """stdout redirected to a file: what was flushed is what a reader of the log sees."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = ""

    def flush(self) -> None:
        self.seen = self.getvalue()

    def isatty(self) -> bool:
        return False


def test_eval_lines_reach_a_log_file_at_once(monkeypatch) -> None:
    stream = RecordingStream()
    monkeypatch.setattr(sys, "stdout", stream)
    logger = MetricsLogger(None, logging_steps=1)
    assert logger.verbose == "lines"
    logger.log_eval({"eval/turn_1/reward_mean": 0.5}, step=4)
    assert stream.seen == "eval @ env_step 4: eval/turn_1/reward_mean=0.5\n"
