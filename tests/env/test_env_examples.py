"""The examples run end to end, quickly, and print what they promise."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_example(name: str, *args: str) -> str:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_custom_loop_prints_the_rewards_of_each_policy() -> None:
    lines = run_example("custom_loop.py").splitlines()
    assert lines[0].startswith("detailed answer 2.5x as long: mean reward 1.000  [1.000, ")
    assert lines[1].startswith("detailed answer 1.0x as long: mean reward 0.368")
    assert lines[2].startswith("detailed answer 4.0x as long: mean reward 0.368")
    assert len(lines) == 3


def test_custom_loop_plays_the_same_loop_with_an_llm_per_agent() -> None:
    lines = run_example("custom_loop.py", "--llm", "tiny").splitlines()
    assert len(lines) == 3
    for episode, line in enumerate(lines):
        match = re.fullmatch(
            rf"tiny episode {episode}: \[(\d+), (\d+)\] characters, reward (.*)", line
        )
        assert match is not None, line
        brief, detailed, reward = int(match[1]), int(match[2]), float(match[3])
        ratio = detailed / brief if brief else 0.0  # the reward of these lengths, by hand
        expected = 0.0 if not brief else math.exp(-max(2.0 - ratio, ratio - 3.0, 0.0))
        assert reward == pytest.approx(expected, abs=5e-4)


def test_pettingzoo_tools_runs_the_checks_the_aec_loop_and_the_wrappers() -> None:
    out = run_example("pettingzoo_tools.py")
    assert out.startswith(
        "check_env passed: parallel_api_test, parallel_seed_test, render_test, "
        "api_test(dict_observations=True), state_test, "
        "multi_turn_determinism, text_contract\n"
    )
    assert "AEC agent_1 turn 2: 38 characters, previous turn's reward 0.327" in out
    assert "AEC agent_1 done after turn 2, last reward 1.000" in out
    assert out.rstrip().endswith(
        "MultiEpisodeParallelEnv: 8 turns over 4 task items, rewards "
        "0.368, 1.000, 0.368, 1.000, 0.368, 1.000, 0.368, 1.000"
    )
