"""The README's model-free code block runs as written (the others need SmolLM2: see the slow
tests and examples/length_ratio.py)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def test_the_environment_block_runs(capsys):
    block = next(b for b in python_blocks() if "CoMLRLEnv(" in b and "smollm2" not in b)
    exec(compile(block, "README.md", "exec"), {})
    assert "{'agent_0': 1.0, 'agent_1': 1.0}" in capsys.readouterr().out


def test_the_commands_match_ci():
    text = README.read_text(encoding="utf-8")
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_command = "bash scripts/setup.sh && python -m pytest -q"
    assert f"```bash\n{test_command}\n```" in text
    assert ci.strip().endswith(test_command)
    assert "```bash\nbash scripts/setup.sh && python examples/length_ratio.py\n```" in text


def test_the_readme_is_a_newcomers_page() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250  # the detail lives in docs/
    for outside in ("SPEC", "seed 00", "B1", "survey", "the issue"):
        assert outside not in text, outside
    assert not re.findall(r"`[0-9a-f]{7}`", text)  # no commit hashes
    # each command with how long it takes, and the fast subset of the tests
    assert "main job" in text and "about 9 to 15 minutes" in text and "about 20 minutes" in text
    assert 'python -m pytest -q -m "not slow"' in text
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (README.parent / link).is_file(), link
