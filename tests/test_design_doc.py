"""docs/design.md's data-flow diagram names real functions in the files it names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
# "<package>/<file>.py  <Name>[.<method>]" and "(<file>.py <function>)" in the diagram.
ARROW = re.compile(r"(cmlrl_(?:env|agents)/(?:\w+/)?\w+\.py)\s+([A-Za-z_][\w.]*)")
INNER = re.compile(r"\(((?:\w+/)?\w+\.py) (\w+)\)")


def _diagram() -> str:
    return re.search(r"^```\n(.*?)^```$", DESIGN.read_text(encoding="utf-8"), re.S | re.M)[1]


def _defined(path: Path) -> set[str]:
    """Top-level functions and classes, and ``Class.method`` for their methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return names


def test_every_arrow_names_a_function_of_its_file() -> None:
    diagram = _diagram()
    arrows = ARROW.findall(diagram)
    assert len(arrows) >= 15, arrows
    for file, name in arrows:
        assert name in _defined(ROOT / file), f"docs/design.md: {file} defines no {name}"
    for file, name in INNER.findall(diagram):
        (path,) = (p for p in ROOT.glob(f"cmlrl_*/**/{file}"))
        assert name in _defined(path), f"docs/design.md: {file} defines no {name}"


def test_the_layout_lists_every_module() -> None:
    text = DESIGN.read_text(encoding="utf-8")
    modules = sorted(
        p.relative_to(next(q for q in p.parents if q.name.startswith("cmlrl_"))).as_posix()
        for p in ROOT.glob("cmlrl_*/**/*.py")
        if p.name != "__init__.py"
    )
    missing = [m for m in modules if f"`{m}`" not in text]
    assert missing == [], f"docs/design.md does not describe {missing}"
