"""Every folder of the two packages is a regular package that a clone of the repo contains."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = sorted(
    {p.parent for package in ("cmlrl_env", "cmlrl_agents") for p in (ROOT / package).rglob("*.py")}
)


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_package_folder_has_an_init_that_git_keeps(folder: Path) -> None:
    init = folder / "__init__.py"
    assert init.is_file(), f"{folder} has no __init__.py (a namespace package: docs miss it)"
    if shutil.which("git") and (ROOT / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", str(init)], cwd=ROOT).returncode == 0
        assert not ignored, f"{init} is ignored by .gitignore, so a clone lacks it"
