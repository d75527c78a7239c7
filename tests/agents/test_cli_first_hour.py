"""What a newcomer meets first with the ``cmlrl`` command: a shipped task that ``check`` does not
make look broken, and a ``--help`` that answers without importing the learning stack."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cmlrl_agents.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]


def test_check_on_a_shipped_task_explains_its_one_warning(capsys) -> None:
    assert main(["check", "--task", "writing"]) == 0
    out = capsys.readouterr().out
    assert out.count("gave 0.0 to every sample joint response") == 1  # one line, not per item
    assert "items 0, 1, 2: reward_func writing_reward gave 0.0" in out
    assert "The samples are check_task's generic ones" in out
    assert out.splitlines()[-1] == (
        "OK: the task passes every check; the 1 warning(s) above flag what works but may not be "
        "meant (none of them stops training)."
    )
