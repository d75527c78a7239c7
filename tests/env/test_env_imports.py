"""`import cmlrl_env` stays light: no torch (SPEC §1), and no pytest for the conformance suite."""

from __future__ import annotations

import subprocess
import sys


def test_import_cmlrl_env_does_not_import_torch_or_pytest() -> None:
    code = (
        "import sys, cmlrl_env\n"
        "from cmlrl_env import CoMLRLEnv, check_env, check_task\n"
        "print(sorted(m for m in ('torch', 'pytest', 'transformers') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]"


def test_public_names_are_exported() -> None:
    import cmlrl_env

    for name in (
        "CoMLRLEnv",
        "RewardProcessors",
        "Task",
        "EpisodeState",
        "Outcome",
        "TaskSource",
        "check_env",
        "check_task",
        "ConformanceError",
        "TaskCheckError",
        "TaskReport",
    ):
        assert name in cmlrl_env.__all__ and hasattr(cmlrl_env, name)
