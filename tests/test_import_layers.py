"""The layering of docs/design.md, read from the code: every import of the two packages (those
inside functions too) as a graph of modules and of sub-packages."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (``from a import b`` counts ``a.b`` when that
    is a module)."""
    modules = {}
    for package in ("cmlrl_env", "cmlrl_agents"):
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def floor(module: str) -> str:
    """``cmlrl_agents.runs.trainer`` -> ``cmlrl_agents.runs``; a top-level module is its own."""
    return ".".join(module.split(".")[:2])


def imports_between_floors() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for module, targets in module_graph().items():
        out[floor(module)].update(floor(t) for t in targets if floor(t) != floor(module))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_two_modules_import_each_other_even_through_others() -> None:
    assert cycles(module_graph()) == []


def test_the_env_knows_nothing_of_the_agents() -> None:
    floors = imports_between_floors()
    for name, targets in floors.items():
        if name.startswith("cmlrl_env"):
            assert not {t for t in targets if t.startswith("cmlrl_agents")}, name


def test_the_lower_floors_of_the_agents_import_only_below_them() -> None:
    floors = imports_between_floors()
    checks = "cmlrl_agents._checks"
    below_policies = {checks, "cmlrl_agents.functional"}
    env = {name for name in floors if name.startswith("cmlrl_env")}
    below_foundation = below_policies | {"cmlrl_agents.policies"} | env
    below_learning = below_foundation | {"cmlrl_agents.foundation"}
    assert floors["cmlrl_agents.functional"] <= {checks}
    assert floors["cmlrl_agents.policies"] <= below_policies
    assert floors["cmlrl_agents.foundation"] <= below_foundation
    assert floors["cmlrl_agents.learning"] <= below_learning
    assert floors["cmlrl_agents.runs"] <= below_learning | {"cmlrl_agents.learning"}


def test_the_floors_form_no_circle() -> None:
    floors = imports_between_floors()
    graph = {
        name: {t for t in targets if t.startswith("cmlrl_agents.")}
        for name, targets in floors.items()
    }
    graph.pop("cmlrl_agents", None)  # the package's lazy exports sit on top of everything
    assert cycles(graph) == []
