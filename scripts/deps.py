"""The development environment's versions: the lock, the newest versions, the declared floors.

Each command installs into a fresh virtual environment (a temporary folder, removed after,
unless ``--venv DIR`` names one to keep) with ``scripts/setup.sh``, exactly as a new machine
does, only against other versions:

- ``python scripts/deps.py lock``: the newest versions that pyproject.toml's ranges admit,
  written to ``constraints.txt`` (the lock that setup.sh installs from, so CI and a fresh clone
  get the same). Run the suite on the new lock before committing it (docs/development.md).
- ``python scripts/deps.py newest [-- PYTEST ARGS]``: the same install, then the suite (all of
  it unless PYTEST ARGS say otherwise); prints the versions that differ from the lock and what
  failed. For refreshing the lock, not for CI: any upstream release can turn it red.
- ``python scripts/deps.py floors env|agents|rllib [-- PYTEST ARGS]``: the lowest versions that
  pyproject.toml admits for the env's dependencies (then ``tests/env``) or the agents'
  (``tests/agents``); ``rllib``: the lock with gymnasium 1.2.2, the release RLlib pins (then
  ``tests/env``). The other packages are resolved by pip, as a user with those floors gets them.

Only the standard library: it runs with any Python 3.11, before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk (setup.sh installs it first)
FLOOR_PACKAGES = {
    "env": ("gymnasium", "pettingzoo", "datasets", "numpy"),
    "agents": ("transformers", "peft", "accelerate", "datasets"),
}
TESTS = {"env": "tests/env", "agents": "tests/agents", "rllib": "tests/env"}
RLLIB_GYMNASIUM = "1.2.2"  # ray[rllib] 2.60 pins gymnasium==1.2.2
# A lock must not ask for a CUDA build: torch 2.13.0's CPU build needs none of these.
CUDA_PACKAGES = re.compile(r"^(nvidia-|triton|cuda-)", re.I)
HEADER = """\
# The development and test environment's exact versions: scripts/setup.sh installs from this
# file (pip -c), so a fresh clone gets what CI tested. Refresh: python scripts/deps.py lock
# (the newest versions pyproject.toml admits, resolved in a fresh venv), then run the suite.
# torch==2.13.0 is the CPU build on this machine's disk (its +cpu wheel satisfies the pin).
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_floors(requirements: list[str]) -> dict[str, str]:
    """``{canonical name: X}`` for each requirement with a ``>=X`` bound (markers dropped)."""
    floors = {}
    for requirement in requirements:
        spec = requirement.split(";")[0]
        match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)", spec)
        if match is None:
            continue
        bound = re.search(r">=\s*([0-9][^,\s]*)", match.group(2))
        if bound:
            floors[canonical(match.group(1))] = bound.group(1)
    return floors


def declared_floors(group: str, pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """The lowest versions pyproject.toml admits for the packages of ``group`` (env, agents)."""
    if group not in FLOOR_PACKAGES:
        raise ValueError(f"group must be one of {sorted(FLOOR_PACKAGES)}, got {group!r}.")
    floors = requirement_floors(tomllib.loads(pyproject.read_text())["project"]["dependencies"])
    missing = [name for name in FLOOR_PACKAGES[group] if name not in floors]
    if missing:
        raise ValueError(
            f"pyproject.toml declares no '>=' floor for {missing} (group {group!r}): give each "
            "a lower bound, so that the floor check knows what to install."
        )
    return {name: floors[name] for name in FLOOR_PACKAGES[group]}


def read_pins(text: str) -> dict[str, str]:
    """``{canonical name: version}`` of the ``name==version`` lines of a lock or a freeze."""
    pins = {}
    for line in text.splitlines():
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line.split("#")[0].strip())
        if match:  # torch's 2.13.0+cpu is the lock's 2.13.0
            pins[canonical(match.group(1))] = match.group(2).split("+")[0]
    return pins


def lock_text(freeze: str) -> str:
    """The lock from ``pip freeze --exclude-editable``: exact pins, torch without ``+cpu``."""
    lines = []
    for line in sorted(freeze.splitlines(), key=str.lower):
        name = line.split("==")[0]
        if "==" not in line or canonical(name) == "cmlrl":
            continue  # the project itself (editable), or a line that is no pin
        if CUDA_PACKAGES.match(name):
            raise ValueError(
                f"the install resolved {line}, a CUDA package: torch 2.13.0's CPU build needs "
                "none; install torch==2.13.0 from this machine's disk first (setup.sh does)."
            )
        lines.append(TORCH if canonical(name) == "torch" else line)
    if TORCH not in lines:
        raise ValueError(f"the install has no {TORCH}: a lock without it pulls a CUDA build.")
    return HEADER + "\n".join(lines) + "\n"


def _venv_env(venv: Path, constraints: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=str(venv), CMLRL_CONSTRAINTS=constraints)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def install(venv: Path, constraints: str) -> str:
    """A fresh venv at ``venv`` with setup.sh run against ``constraints`` ('' for none); the
    venv's ``pip freeze``."""
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = _venv_env(venv, constraints)
    subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], env=env, check=True)
    freeze = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    print(f"installed in {time.monotonic() - start:.0f} s", flush=True)
    return freeze


def run_tests(venv: Path, args: list[str]) -> int:
    """The suite (or ``args``) in the venv, from the repository root; pytest's exit code."""
    start = time.monotonic()
    command = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-rfE", *args]
    print("$", " ".join(command), flush=True)
    code = subprocess.run(command, cwd=ROOT, env=_venv_env(venv, "")).returncode
    print(f"tests exited {code} after {time.monotonic() - start:.0f} s", flush=True)
    return code


def differences(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """Lines ``name old -> new`` for every package whose pin differs (``-`` where absent)."""
    return [
        f"{name} {old.get(name, '-')} -> {new.get(name, '-')}"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def floor_constraints(group: str) -> str:
    """The constraints of a floor check: ``floors`` of ``group``, or the lock with RLlib's
    gymnasium for ``rllib``."""
    if group == "rllib":
        pins = read_pins(LOCK.read_text()) | {"gymnasium": RLLIB_GYMNASIUM}
        return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))
    floors = declared_floors(group)
    return "".join(f"{name}=={version}\n" for name, version in floors.items()) + TORCH + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["lock", "newest", "floors"])
    parser.add_argument("group", nargs="?", choices=["env", "agents", "rllib"])
    parser.add_argument("--venv", type=Path, help="install here and keep it (default: a temp)")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, pytest_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    if (args.command == "floors") != (args.group is not None):
        parser.error(
            f"got {args.command} with group {args.group!r}: floors takes one of env, agents, "
            "rllib (python scripts/deps.py floors env); lock and newest take none"
        )
    venv = args.venv or Path(tempfile.mkdtemp(prefix="cmlrl-deps-")) / "venv"
    if venv.exists() and any(venv.iterdir()):
        parser.error(f"--venv {venv} is not empty: name a new folder (each check starts fresh)")
    try:
        return _run(args.command, args.group, venv, pytest_args)
    finally:
        if args.venv is None:
            shutil.rmtree(venv.parent, ignore_errors=True)


def _run(command: str, group: str | None, venv: Path, pytest_args: list[str]) -> int:
    if command == "lock":
        LOCK.write_text(lock_text(install(venv, "")))
        print(f"wrote {LOCK.relative_to(ROOT)}: now run the suite on it (docs/development.md)")
        return 0
    if command == "newest":
        freeze = install(venv, "")
        changed = differences(read_pins(LOCK.read_text()), read_pins(freeze))
        print("lock -> newest:", *(changed or ["no change"]), sep="\n  ", flush=True)
        return run_tests(venv, pytest_args)
    assert group is not None
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as file:
        file.write(floor_constraints(group))
    try:
        freeze = install(venv, file.name)
    finally:
        os.unlink(file.name)
    pins = read_pins(freeze)
    names = FLOOR_PACKAGES.get(group, ("gymnasium",))
    print("installed:", ", ".join(f"{name}=={pins.get(name, '?')}" for name in names), flush=True)
    return run_tests(venv, pytest_args or [TESTS[group]])


if __name__ == "__main__":
    sys.exit(main())
