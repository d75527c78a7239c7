"""What the code reward judges from the syntax tree alone: the code, the names it binds, the tests.

``extract_code`` takes a completion's code, ``split_single_program`` splits one agent's program
into the helper (``aux``) and the rest, ``bound_names`` counts every way a piece of code binds a
name, ``aux_usage`` says whether the main function calls ``aux`` and whether it discards a
call's result, ``is_wrapper`` whether it only forwards ``aux``'s result, and ``test_plan`` cuts
a problem's test module into the statements the checker runs.
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections import Counter

__all__ = [
    "HELPER_NAME",
    "aux_usage",
    "bound_names",
    "count_tests",
    "extract_code",
    "has_return",
    "is_wrapper",
    "parse",
    "split_single_program",
    "test_plan",
    "top_functions",
]

HELPER_NAME = "aux"
Function = ast.FunctionDef | ast.AsyncFunctionDef
# Any info string (```python3, ```PY, ```py title="x"), and a line end of \r\n too.
_FENCE = re.compile(r"```[^`\n]*\r?\n(.*?)(?:```|\Z)", re.S)


def extract_code(completion: str) -> str:
    """The first fenced code block of a completion, or the whole completion if it has none."""
    match = _FENCE.search(completion)
    return textwrap.dedent(match.group(1) if match else completion).strip("\n")


def parse(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def top_functions(tree: ast.Module | None) -> dict[str, Function]:
    if tree is None:
        return {}
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def split_single_program(code: str) -> tuple[str, str]:
    """One agent's program as (helper code, main code): the ``aux`` definition, and the rest."""
    tree = parse(code)
    aux = top_functions(tree).get(HELPER_NAME)
    if tree is None or aux is None:
        return "", code
    # The syntax tree's line numbers count \n, \r\n and \r only (str.splitlines also breaks
    # at \x0c, \x1c-\x1e, \x85, \u2028 and \u2029, which a comment or string may hold).
    lines = code.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = (aux.decorator_list[0].lineno if aux.decorator_list else aux.lineno) - 1
    end = aux.end_lineno or aux.lineno
    return "\n".join(lines[start:end]), "\n".join(lines[:start] + lines[end:])


def _names_bound_by(node: ast.AST) -> list[str]:
    if isinstance(node, ast.alias):  # import a.b binds a; import x as y and from m import x as y
        return [node.asname or node.name.split(".")[0]]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
        return [node.id]
    if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
        return [node.attr]  # module.aux = ..., sys.modules[__name__].aux = ...
    if isinstance(node, ast.arg):
        return [node.arg]  # a parameter (of a def or a lambda) shadows the global
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]  # globals()["aux"] = ..., setattr(module, "aux", ...)
    if isinstance(node, ast.MatchMapping):
        return [node.rest] if node.rest else []
    name = getattr(node, "name", None)  # def, class, except ... as, match captures, type params
    return [name] if isinstance(name, str) else []


def bound_names(tree: ast.AST | None) -> Counter[str]:
    """How often each name is bound anywhere in ``tree``: definitions, assignments of every kind
    (targets, augmented, annotated, walrus, for, with ... as, except ... as, match captures,
    del), imports, parameters, global/nonlocal declarations, attribute stores, and string
    constants (the name handed to ``globals()[...]`` or ``setattr``)."""
    counts: Counter[str] = Counter()
    for node in ast.walk(tree) if tree is not None else ():
        counts.update(_names_bound_by(node))
    return counts


def has_return(function: Function) -> bool:
    """Whether the function holds a ``return`` statement (the paper's level 1 asks for one)."""
    return any(isinstance(n, ast.Return) for n in ast.walk(function))


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
    ]


def aux_usage(main: Function) -> tuple[bool, bool]:
    """(main calls aux, some call of aux is a bare expression statement: its result discarded)."""
    calls = _calls(main, HELPER_NAME)
    bare = {
        id(n.value)
        for n in ast.walk(main)
        if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
    }
    return bool(calls), any(id(c) in bare for c in calls)


def is_wrapper(main: Function) -> bool:
    """Whether main only forwards aux's result: its body, a docstring aside, is ``return E`` or
    ``v = E`` then ``return v``, with ``E`` calling aux (the paper's ``is_wrapper_function``,
    on statements rather than lines, so that one statement written over two lines is still
    one, and the two forms judged alike)."""
    body = list(main.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring (or any constant expression before the code)
    if len(body) == 1 and isinstance(body[0], ast.Return):
        return body[0].value is not None and bool(_calls(body[0].value, HELPER_NAME))
    if len(body) != 2 or not isinstance(body[0], ast.Assign) or len(body[0].targets) != 1:
        return False
    target, last = body[0].targets[0], body[1]
    return (
        isinstance(target, ast.Name)
        and bool(_calls(body[0].value, HELPER_NAME))
        and isinstance(last, ast.Return)
        and isinstance(last.value, ast.Name)
        and last.value.id == target.id
    )


def _is_test(statement: ast.stmt) -> bool:
    """A statement of ``check`` is a test when it holds an ``assert`` and calls ``candidate``."""
    nodes = list(ast.walk(statement))
    return any(isinstance(n, ast.Assert) for n in nodes) and bool(_calls(statement, "candidate"))


@functools.lru_cache(maxsize=512)
def test_plan(test: str) -> tuple[tuple[str, ...], tuple[tuple[bool, str], ...]]:
    """(the test module's top-level statements but ``check``, the statements of ``check`` as
    (is a test, source)); empty when ``test`` defines no ``check``. A test is a statement that
    holds an ``assert`` and calls ``candidate``: ``assert True, "..."`` is not one, a loop
    whose body calls ``candidate`` and asserts is one, and a repeated test counts once (it
    still runs), as in the paper's ``extract_test_cases``."""
    tree = parse(test)
    check = top_functions(tree).get("check")
    if tree is None or check is None:
        return (), ()
    setup = tuple(ast.unparse(n) for n in tree.body if n is not check)
    statements, seen = [], set()
    for statement in check.body:
        source = ast.unparse(statement)  # the same source: the same test, counted once
        statements.append((_is_test(statement) and source not in seen, source))
        seen.add(source)
    return setup, tuple(statements)


def count_tests(test: str) -> int:
    """Statements of ``check(candidate)`` that hold an ``assert`` and call ``candidate``."""
    return sum(is_test for is_test, _ in test_plan(test)[1])
