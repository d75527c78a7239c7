"""The code budget of the project's aesthetics, as a report for the reader: the modules over 400
lines and the functions over 60 (a function counts from its ``def``, decorators excluded, to its
last line, docstring included).

    python scripts/code_budget.py

A module near the budget usually holds two ideas and a long function two steps: a row here is a
place to look, not a verdict (packing lines to meet the number makes code worse).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cmlrl_env", "cmlrl_agents")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def modules() -> list[Path]:
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


def report() -> list[str]:
    """One line per module over its budget and per function over its own."""
    lines = []
    for path in modules():
        source = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT)
        if over := module_overruns(source):
            lines.append(f"{name}: {len(source.splitlines())} lines ({over} over)")
        lines += [f"{name}: {func}, {n} lines" for func, n in long_functions(source)]
    return lines


def main() -> int:
    lines = report()
    print(f"modules over {MAX_MODULE_LINES} lines, functions over {MAX_FUNCTION_LINES}:")
    print("\n".join(lines) if lines else "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
