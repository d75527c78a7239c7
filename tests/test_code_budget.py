"""The code budget of the project's aesthetics: modules at most 400 lines, functions at most 60.

A function's length counts from its ``def`` (decorators excluded) to its last line, docstring
included, so a long docstring is a reason to split a function as much as long code is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cmlrl_env", "cmlrl_agents")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def module_overruns(source: str, limit: int = MAX_MODULE_LINES) -> int:
    """Lines over ``limit`` (0 when within budget)."""
    return max(0, len(source.splitlines()) - limit)


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """``(qualified name, lines)`` of every function or method longer than ``limit`` lines."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                    if length > limit:
                        found.append((name, length))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_the_budget_checks_count_what_they_claim() -> None:
    fits = "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(59))  # 60 lines
    method = "    def g(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(61))
    assert long_functions(fits) == []
    assert long_functions("class C:\n" + method) == [("C.g", 62)]
    assert long_functions(fits.replace("def f", "def outer():\n  def f")) == [("outer", 61)]
    assert module_overruns("a\n" * 400) == 0
    assert module_overruns("a\n" * 403) == 3


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_and_functions_fit_the_budget(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    over = module_overruns(source)
    assert not over, (
        f"{path.relative_to(ROOT)} has {len(source.splitlines())} lines, over the "
        f"{MAX_MODULE_LINES}-line budget; split it along the data flow (docs/design.md)."
    )
    assert long_functions(source) == [], (
        f"{path.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines; split them."
    )
