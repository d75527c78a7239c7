"""The code budget's report (``scripts/code_budget.py``) counts what it claims; the numbers are
for the reader (a module near 400 lines or a function near 60 is a place to look), not a gate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from code_budget import long_functions, module_overruns  # noqa: E402


def test_the_budget_checks_count_what_they_claim() -> None:
    fits = "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(59))  # 60 lines
    method = "    def g(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(61))
    assert long_functions(fits) == []
    assert long_functions("class C:\n" + method) == [("C.g", 62)]
    assert long_functions(fits.replace("def f", "def outer():\n  def f")) == [("outer", 61)]
    assert module_overruns("a\n" * 400) == 0
    assert module_overruns("a\n" * 403) == 3


def test_the_report_prints_a_line_per_overrun() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "code_budget.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith("modules over 400 lines, functions over 60:")
