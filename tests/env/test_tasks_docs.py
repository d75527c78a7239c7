"""Every python block of docs/tasks.md runs, top to bottom, in one namespace."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "tasks.md"


def test_docs_tasks_md_python_blocks_run() -> None:
    blocks = re.findall(
        r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), flags=re.S | re.M
    )
    assert len(blocks) >= 7
    namespace: dict[str, object] = {"__name__": "docs_tasks_md"}
    for number, block in enumerate(blocks, start=1):
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(block, f"docs/tasks.md block {number}", "exec"), namespace)
            except Exception as exc:
                exc.add_note(f"in python block {number} of docs/tasks.md:\n{block}")
                raise
