"""The type check CI runs (``mypy``, configured in pyproject.toml) keeps covering what it must:
both packages, strict on every module either package exports names from, on ``functional/``,
``learning/`` and the configs, with every flag ``--strict`` turns on."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MYPY = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]

# --strict's flags that a per-module section can set, as config keys and values. mypy applies
# `strict = true` to every module whatever section holds it, so the strict section lists these.
STRICT_PER_MODULE = {
    "disallow_any_generics": True,
    "disallow_subclassing_any": True,
    "disallow_untyped_calls": True,
    "disallow_untyped_defs": True,
    "disallow_incomplete_defs": True,
    "check_untyped_defs": True,
    "disallow_untyped_decorators": True,
    "warn_unused_ignores": True,
    "warn_return_any": True,
    "implicit_reexport": False,
    "strict_equality": True,
    "extra_checks": True,
}
STRICT_GLOBAL_ONLY = {"warn_redundant_casts": True}


def strict_patterns() -> list[str]:
    sections = [o for o in MYPY.get("overrides", []) if o.get("disallow_any_generics") is True]
    assert len(sections) == 1, "one [[tool.mypy.overrides]] section holds the strict modules"
    return list(sections[0]["module"])


def strict_settings(module: str) -> dict[str, object]:
    """The settings the config gives ``module``: the global ones, then those of every override
    whose pattern matches it (no two of which set one key)."""
    settings = {k: v for k, v in MYPY.items() if k != "overrides"}
    for section in MYPY.get("overrides", []):
        if any(_matches(module, p) for p in section["module"]):
            settings.update({k: v for k, v in section.items() if k != "module"})
    return settings


def _matches(module: str, pattern: str) -> bool:
    # "a.*" is a and every module under it, as mypy reads it
    if pattern.endswith(".*"):
        return module == pattern[:-2] or module.startswith(pattern[:-1])
    return module == pattern


def exported_modules() -> set[str]:
    """The modules whose names ``cmlrl_env`` and ``cmlrl_agents`` export (cmlrl_agents names
    them in its ``TYPE_CHECKING`` imports and imports them on first use)."""
    modules = set()
    for package in ("cmlrl_env", "cmlrl_agents"):
        tree = ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))
        modules |= {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(package)
        }
    return modules


def test_both_packages_are_checked_and_nothing_else() -> None:
    assert MYPY["packages"] == ["cmlrl_env", "cmlrl_agents"]


def test_every_module_is_fully_annotated() -> None:
    assert MYPY["disallow_untyped_defs"] is True
    assert MYPY["disallow_incomplete_defs"] is True
    assert MYPY["warn_unused_ignores"] is True  # an ignore that nothing needs fails the check


def test_the_public_api_functional_learning_and_configs_are_strict() -> None:
    must = exported_modules() | {
        "cmlrl_env",
        "cmlrl_agents",
        "cmlrl_agents.functional.losses",
        "cmlrl_agents.learning.engine",
        "cmlrl_agents.foundation.config",
        "cmlrl_agents.algorithms.magrpo_config",
        "cmlrl_agents.algorithms.actor_critic_config",
        "cmlrl_agents.algorithms.preference_config",
    }
    # the exported list is read from the packages: it cannot come out empty or partial unnoticed
    assert {"cmlrl_env.env", "cmlrl_env.task_spec", "cmlrl_agents.algorithms.magrpo"} <= must
    patterns = strict_patterns()
    assert {"cmlrl_agents.functional.*", "cmlrl_agents.learning.*"} <= set(patterns)
    for module in sorted(must):
        settings = strict_settings(module)
        for key, value in {**STRICT_PER_MODULE, **STRICT_GLOBAL_ONLY}.items():
            assert settings.get(key) == value, f"{module}: {key} must be {value}"


def test_no_module_pattern_is_stale() -> None:
    # a pattern that matches no file is a module renamed or moved out of the strict list
    files = {
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for package in ("cmlrl_env", "cmlrl_agents")
        for p in (ROOT / package).rglob("*.py")
    }
    for pattern in strict_patterns():
        assert any(_matches(m, pattern) for m in files), f"{pattern} matches no module"


def test_the_strict_flags_are_all_of_mypys() -> None:
    """If a mypy release adds a flag to --strict, this names it (add it to the strict section
    and to ``STRICT_PER_MODULE``)."""
    pytest.importorskip("mypy")
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--help"], capture_output=True, text=True, check=True
    ).stdout
    block = re.search(r"--strict\s+Strict mode; enables the following flags:(.*?)\n  --", out, re.S)
    assert block, "mypy --help no longer lists the flags of --strict"
    # the help wraps long flags after a hyphen: join the lines back
    flags = re.findall(r"--([a-z-]+)", re.sub(r"\s+", "", block.group(1)))
    keys = {f.replace("-", "_").removeprefix("no_") for f in flags}
    assert keys == set(STRICT_PER_MODULE) | set(STRICT_GLOBAL_ONLY), keys


def test_ci_runs_mypy_before_the_tests() -> None:
    lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert "mypy" in lines
    assert lines.index("mypy") < len(lines) - 1  # the README's test command stays last
