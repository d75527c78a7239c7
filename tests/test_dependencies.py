"""The lock (constraints.txt) is what setup.sh installs and what pyproject.toml admits, with the
CPU torch and no CUDA package; scripts/deps.py reads the floors that pyproject.toml declares."""

from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def load_deps():
    spec = importlib.util.spec_from_file_location("deps", ROOT / "scripts" / "deps.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


deps = load_deps()
LOCK = deps.read_pins((ROOT / "constraints.txt").read_text(encoding="utf-8"))


def test_every_line_of_the_lock_is_an_exact_pin() -> None:
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        assert line.startswith("#") or re.fullmatch(r"[A-Za-z0-9._-]+==[^\s;]+", line), line


def test_the_lock_has_the_cpu_torch_and_no_cuda_package() -> None:
    assert LOCK["torch"] == "2.13.0"
    assert not [name for name in LOCK if deps.CUDA_PACKAGES.match(name)]


@pytest.mark.parametrize("extra", [None, "dev"])
def test_the_lock_pins_each_requirement_inside_its_declared_range(extra: str | None) -> None:
    project = PYPROJECT["project"]
    requirements = project["optional-dependencies"][extra] if extra else project["dependencies"]
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        assert name in LOCK, f"{name} is required ({text}) but constraints.txt has no pin"
        assert requirement.specifier.contains(LOCK[name], prereleases=True), (name, LOCK[name])


def test_setup_installs_from_the_lock_unless_told_otherwise() -> None:
    setup = (ROOT / "scripts" / "setup.sh").read_text(encoding="utf-8")
    assert "constraints=${CMLRL_CONSTRAINTS-constraints.txt}" in setup
    assert setup.count('"${pip[@]}"') == 3  # torch, the project, the model: each with -c


def test_the_floors_are_pyprojects_lower_bounds() -> None:
    assert deps.declared_floors("env") == {
        "gymnasium": "1.1",
        "pettingzoo": "1.25",
        "datasets": "2.19",
        "numpy": "2.0",
    }
    assert set(deps.declared_floors("agents")) == {"transformers", "peft", "accelerate", "datasets"}
    floors = deps.floor_constraints("agents").splitlines()
    assert "torch==2.13.0" in floors and "peft==0.15" in floors


def test_a_missing_floor_names_the_package_and_the_fix(tmp_path: Path) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["gymnasium<2", "numpy>=1.24"]\n')
    with pytest.raises(ValueError, match=r"no '>=' floor for \['gymnasium', .*give each"):
        deps.declared_floors("env", pyproject)
    with pytest.raises(ValueError, match="group must be one of .*'rl'"):
        deps.declared_floors("rl", pyproject)


def test_rllibs_check_is_the_lock_with_its_gymnasium() -> None:
    pins = deps.read_pins(deps.floor_constraints("rllib"))
    assert pins == LOCK | {"gymnasium": "1.2.2"}


def test_a_lock_is_written_from_a_freeze() -> None:
    freeze = "numpy==2.4.6\ntorch==2.13.0+cpu\nPyYAML==6.0.4\n"
    text = deps.lock_text(freeze)
    assert text.startswith("#") and text.endswith("numpy==2.4.6\nPyYAML==6.0.4\ntorch==2.13.0\n")
    with pytest.raises(ValueError, match="nvidia-cublas==13.0.0, a CUDA package"):
        deps.lock_text(freeze + "nvidia-cublas==13.0.0\n")
    with pytest.raises(ValueError, match="no torch==2.13.0"):
        deps.lock_text("numpy==2.4.6\n")


def test_the_differences_name_each_changed_package() -> None:
    old, new = {"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "4", "d": "5"}
    assert deps.differences(old, new) == ["b 2 -> 4", "c 3 -> -", "d - -> 5"]


def test_the_development_page_documents_the_commands() -> None:
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    for command in (
        "python scripts/deps.py lock",
        "python scripts/deps.py newest",
        "python scripts/deps.py floors env",
        "python scripts/deps.py floors agents",
        "python scripts/deps.py floors rllib",
    ):
        assert command in page, command
