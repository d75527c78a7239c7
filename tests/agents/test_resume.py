"""Checkpoint and resume: 4 items straight == 2 items, crash, resume in a new process, 2 items."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import hashlib, json, os, sys
    from datasets import Dataset
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
    from cmlrl_agents.testing import tiny_agent
    from cmlrl_env import tasks

    mode, out = sys.argv[1], sys.argv[2]
    train = tasks.length_ratio_dataset().select(range(4))
    evaluation = tasks.length_ratio_dataset().select(range(8, 10))

    def reward(brief, detailed, *, batch_items):
        if mode == "crash" and batch_items[0]["prompt"] == train[2]["prompt"]:
            raise RuntimeError("simulated crash after the first checkpoint")
        return tasks.length_ratio_reward(brief, detailed, batch_items=batch_items)

    config = MAGRPOConfig(num_generations=2, max_new_tokens=5, rollout_buffer_size=2,
                          eval_interval=2, eval_num_samples=1, logging_steps=1, seed=0,
                          agent_learning_rate=1e-3, save_steps=2, save_total_limit=2,
                          output_dir=out)
    trainer = MAGRPOTrainer(agents=[tiny_agent(0), tiny_agent(1)],
                            formatters=[tasks.brief_formatter, tasks.detailed_formatter],
                            reward_func=reward, train_dataset=train, eval_dataset=evaluation,
                            args=config)
    try:
        trainer.train(resume_from_checkpoint="latest" if mode == "resume" else None)
    except RuntimeError as exc:
        print("CRASHED", exc)
        sys.exit(3)
    digest = hashlib.sha256()
    for agent in trainer.agents:
        for name, tensor in sorted(agent.model.state_dict().items()):
            digest.update(name.encode() + tensor.numpy().tobytes())
    print("RESULT " + json.dumps({"params": digest.hexdigest(),
                                  "history": trainer.logger.history,
                                  "env_step": trainer.env_step}))
""")


def run(mode: str, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, mode, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def test_resume_in_a_new_process_matches_training_straight(tmp_path):
    straight = result(run("straight", tmp_path / "straight"))
    crashed = run("crash", tmp_path / "resumed")
    assert crashed.returncode == 3 and "CRASHED" in crashed.stdout, crashed.stderr[-2000:]
    checkpoints = sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir())
    assert checkpoints == ["checkpoint-2"]
    resumed = result(run("resume", tmp_path / "resumed"))
    assert resumed["params"] == straight["params"]
    assert resumed["history"] == straight["history"]
    assert resumed["env_step"] == straight["env_step"] == 8
    # the metric files hold each entry once, as in the straight run
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == len(straight["history"])
    assert sorted(p.name for p in (tmp_path / "resumed" / "checkpoints").iterdir()) == [
        "checkpoint-2",
        "checkpoint-4",
    ]


def test_latest_without_checkpoint_says_what_to_do(tmp_path):
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
    from cmlrl_agents.testing import tiny_agent
    from cmlrl_env import tasks

    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset(),
        args=MAGRPOConfig(output_dir=str(tmp_path / "run")),
    )
    with pytest.raises(FileNotFoundError, match="holds no complete checkpoint"):
        trainer.train(resume_from_checkpoint="latest")
