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
        "OK: the task passes every check. The 1 warning(s) above flag what works but may not be "
        "meant; none of them stops training."
    )


HEAVY = ("torch", "transformers", "peft")


def imported_after(code: str) -> list[str]:
    """The heavy libraries a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1].replace("'", '"'))


def test_help_and_a_usage_error_import_no_model_library() -> None:
    code = (
        "from cmlrl_agents.cli import main\n"
        "assert main(['--help']) == 0\n"
        "assert main(['train']) == 2\n"  # the run file is missing
    )
    assert imported_after(code) == []


def test_check_loads_no_model_library() -> None:
    tiny = ROOT / "examples" / "configs" / "tiny.yaml"
    code = f"from cmlrl_agents.cli import main\nassert main(['check', {str(tiny)!r}]) == 0\n"
    assert imported_after(code) == []


def test_import_cmlrl_agents_loads_its_names_on_use() -> None:
    assert imported_after("import cmlrl_agents") == []
    assert imported_after("from cmlrl_agents import MAGRPOConfig") == []
    # the trainer needs torch and transformers; peft comes along where transformers imports it
    # (5.x does, 4.56 does not: it stays unloaded until an adapter agent needs it)
    loaded = imported_after("from cmlrl_agents import MAGRPOTrainer")
    assert {"torch", "transformers"} <= set(loaded), loaded
