"""Reading a ``cmlrl`` run file: YAML with duplicate keys refused, ``--set`` overrides, import
paths, and the one-line errors (``CLIError``) that ``cmlrl`` prints with exit status 2.

Kept apart from :mod:`cmlrl_agents.cli.tasks`, which turns the ``task`` section into an env's
pieces.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "SECTIONS",
    "CLIError",
    "add_to_path",
    "apply_overrides",
    "check_keys",
    "load_spec",
    "one_line",
    "parse_value",
    "resolve_import",
]

SECTIONS = ("algorithm", "model", "task", "config", "peft", "wandb")


class CLIError(Exception):
    """A mistake in the run file or the command line: shown as one line, exit status 2."""


# PyYAML follows YAML 1.1, where `1e-5` (no dot) is a string; learning rates are written so.
class _Loader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        # PyYAML keeps the last of two equal keys without a word; a run file that sets
        # agent_learning_rate twice has a mistake in it, so it is refused.
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.YAMLError(
                    f"the key {key!r} is given twice (lines {seen[key] + 1} and "
                    f"{key_node.start_mark.line + 1}); keep one"
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_value(text: str) -> Any:
    """A ``--set`` value as a YAML scalar (or flow list/dict): ``1e-5``, ``true``, ``[a, b]``."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise CLIError(f"cannot parse the value {text!r}: {one_line(exc)}") from None


def load_spec(path: str | Path) -> dict[str, Any]:
    """Read a run file: a YAML mapping whose keys are among ``SECTIONS``."""
    path = Path(path)
    if not path.is_file():
        raise CLIError(f"run file {str(path)!r} not found.")
    try:
        spec = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as exc:
        raise CLIError(f"{path} is not valid YAML: {one_line(exc)}") from None
    if not isinstance(spec, Mapping):
        raise CLIError(
            f"{path} must hold a mapping with the sections {list(SECTIONS)}, got "
            f"{type(spec).__name__}."
        )
    check_keys(spec, SECTIONS, f"section of {path.name}")
    return dict(spec)


def check_keys(given: Mapping[str, Any], valid: Sequence[str], what: str) -> None:
    """Reject keys outside ``valid``, naming the closest valid one and listing them all."""
    for key in given:
        if key not in valid:
            close = difflib.get_close_matches(str(key), list(valid), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CLIError(f"unknown {what} {key!r}{hint}; valid: {', '.join(valid)}.")


def apply_overrides(spec: dict[str, Any], assignments: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` assignments (``--set``) to a copy of ``spec``."""
    spec = {k: dict(v) if isinstance(v, Mapping) else v for k, v in spec.items()}
    for assignment in assignments:
        key, sep, text = assignment.partition("=")
        if not sep or not key:
            raise CLIError(f"--set {assignment!r} is not of the form section.key=value.")
        section, *rest = key.strip().split(".")
        check_keys({section: None}, SECTIONS, "section in --set")
        value = parse_value(text)
        if not rest:
            spec[section] = value
            continue
        current = spec.get(section)
        if isinstance(current, str):  # `model: tiny` becomes `model: {name_or_path: tiny}`
            current = {("name_or_path" if section == "model" else "name"): current}
        if current is not None and not isinstance(current, Mapping):
            raise CLIError(f"--set {key}: section {section!r} is {current!r}, not a mapping.")
        target = spec[section] = dict(current or {})
        for part in rest[:-1]:
            nested = target.get(part)
            target[part] = dict(nested) if isinstance(nested, Mapping) else {}
            target = target[part]
        target[rest[-1]] = value
    return spec


def resolve_import(ref: Any, what: str) -> Any:
    """``"package.module:name"`` or ``"path/to/file.py:name"`` (``name`` may be dotted) → the
    object; anything that is not a string is returned as it is."""
    if not isinstance(ref, str):
        return ref
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise CLIError(
            f"{what}={ref!r} is not an import path; write 'package.module:function' or "
            "'path/to/file.py:function'."
        )
    try:
        obj: Any = _import_module(module_name)
    except CLIError:
        raise
    except Exception as exc:  # the user's module failed while importing: say which one
        raise CLIError(f"{what}: importing {module_name!r} failed: {one_line(exc)}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise CLIError(
                f"{what}: {module_name!r} has no attribute {attr!r}; it defines {names[:20]}."
            )
        obj = getattr(obj, part)
    return obj


def _import_module(name: str) -> Any:
    if name.endswith(".py"):
        path = Path(name).expanduser().resolve()
        if not path.is_file():
            raise CLIError(f"file {name!r} not found.")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None  # a .py file always has both
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)  # pickling/multiprocessing find it by name
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise CLIError(
                f"module {name!r} not found; run cmlrl from the folder that holds it, or add "
                "that folder to PYTHONPATH."
            ) from None
        raise


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def add_to_path(folder: Path) -> None:
    """Let ``module:function`` names find modules in ``folder`` (a run or experiment file's,
    or the working folder, which a console script's ``sys.path`` lacks)."""
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
