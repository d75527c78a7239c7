"""Every python block of docs/env.md runs, top to bottom, in one namespace."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "env.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


def test_docs_env_md_has_runnable_python_blocks() -> None:
    blocks = python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 10
    namespace: dict[str, object] = {"__name__": "docs_env_md"}
    for number, block in enumerate(blocks, start=1):
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(block, f"docs/env.md block {number}", "exec"), namespace)
            except Exception as exc:
                exc.add_note(f"in python block {number} of docs/env.md:\n{block}")
                raise
