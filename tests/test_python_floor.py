"""The Python floor that pyproject.toml claims is the one the code is linted for and, in CI,
the one the whole suite runs on: CI's interpreter is the floor, so a passing CI proves it."""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

import pytest

PYPROJECT = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def floor() -> tuple[int, int]:
    match = re.fullmatch(r">=\s*(\d+)\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert match, "requires-python must be a plain '>=X.Y' floor"
    return int(match.group(1)), int(match.group(2))


def test_ruff_targets_the_floor() -> None:
    major, minor = floor()
    assert PYPROJECT["tool"]["ruff"]["target-version"] == f"py{major}{minor}"


def test_mypy_targets_the_floor() -> None:
    major, minor = floor()
    assert PYPROJECT["tool"]["mypy"]["python_version"] == f"{major}.{minor}"


def test_this_interpreter_satisfies_the_floor() -> None:
    assert sys.version_info[:2] >= floor()


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI runs the suite on the floor")
def test_ci_runs_on_the_floor() -> None:
    assert sys.version_info[:2] == floor(), (
        f"CI runs Python {sys.version.split()[0]} but pyproject.toml claims {floor()}: the "
        "suite passing here would not prove the floor"
    )
