"""Every python block of the guides (env, tasks, preference) runs, in one namespace per guide."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", text, flags=re.S | re.M)


# The minimum block counts catch a guide whose fences stopped matching (then nothing would run).
@pytest.mark.parametrize(
    ("guide", "min_blocks"), [("env.md", 10), ("tasks.md", 7), ("preference.md", 7)]
)
def test_guide_python_blocks_run(guide: str, min_blocks: int) -> None:
    blocks = python_blocks((DOCS / guide).read_text(encoding="utf-8"))
    assert len(blocks) >= min_blocks
    namespace: dict[str, object] = {"__name__": f"docs_{guide.replace('.', '_')}"}
    for number, block in enumerate(blocks, start=1):
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                exec(compile(block, f"docs/{guide} block {number}", "exec"), namespace)
            except Exception as exc:
                exc.add_note(f"in python block {number} of docs/{guide}:\n{block}")
                raise
