"""Library code never imports the test helpers (``cmlrl_agents.testing``); the CLI's tiny model
comes from ``cmlrl_agents.tiny_models``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_library_module_imports_the_testing_helpers() -> None:
    modules = [p for p in ROOT.glob("cmlrl_*/**/*.py") if p.name != "testing.py"]
    assert len(modules) > 50
    offenders = [p.name for p in modules if "cmlrl_agents.testing" in _imports(p)]
    assert offenders == []
