"""Run untrusted Python (model-written code) in separate, limited processes.

Each program runs as ``python -I -S -B program.py`` (isolated mode, no site-packages) in a
process of its own, with an environment holding only ``PATH``, ``HOME``, ``TMPDIR`` and
``LANG`` (none of the trainer's variables: no tokens, no keys), resource limits (CPU seconds,
address space, the size of any file written, stdout and stderr included, open files, processes)
and a wall-clock limit. A launcher process sets it up and stays outside it (see
``_sandbox_child.py``); what this machine allows is probed once (``isolation()``):

- ``network``: a network namespace: no network, only a loopback that is down.
- ``namespaces``: IPC, mount and PID namespaces. The run's System V IPC objects and POSIX
  queues die with it; /tmp is a tmpfs of ``tmp_size_mb`` of its own, which /dev/shm, /var/tmp
  and /run/lock share; its processes are gone, zombies included, before it returns; the
  trainer's site-packages, its home and ``hidden_paths`` are covered by empty folders.
  Without this (a container that forbids namespaces) and as root, the run's processes, IPC
  objects and files in those folders are found by its user id and removed after it.
- ``read_only``: every other mount is read-only for the run.
- ``proc``: its /proc shows only its own processes.
- ``memory``: a bound of ``memory_mb`` for the run as a whole, where this process may create
  cgroups: cgroup v2 ``memory.max``, or cgroup v1 ``memory.limit_in_bytes`` where v2 hands out
  no memory controller; elsewhere ``memory_mb`` holds per process, so a run holds at most
  ``memory_mb × max_processes`` (plus ``tmp_size_mb``).

Started as root, each concurrent run also gets a user id of its own (from ``uid_base``): it
cannot read the trainer's private files or signal other processes, and the process cap counts
only its own processes; an id is handed back only once none of its processes is left. Without
root, the namespaces come with a user namespace, where available: the run is user 1000 inside,
the trainer's user outside, and the read-only mounts keep it from the trainer's files. Without
root and without user namespaces nothing of this holds: the program runs as the trainer's user,
with the host's network and file system.

A ``Checker`` is trusted code that runs in the launcher while the program runs and talks with
it over two pipes; its report comes back in ``RunResult.report`` (the code reward's tests run
this way, outside the program). ``run_programs(sources, limits)`` runs a batch in parallel (one
thread waits per run); a hung or crashing program costs its own time limit and ends as a
``RunResult`` with a reason, never as an exception in the trainer.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cmlrl_env import _sandbox_host as host
from cmlrl_env._sandbox_host import Isolation, isolation

__all__ = [
    "Checker",
    "Isolation",
    "RunResult",
    "SandboxLimits",
    "isolation",
    "network_isolation",
    "run_program",
    "run_programs",
]

_SETUP_FAILED = 111  # _sandbox_child.SETUP_FAILED
_BACKSTOP_S = 5.0  # how long past the wall clock the launcher itself may take
NETWORK_MODES = ("auto", "isolate", "host")
_CLONE_NEWNET, _RUN_FLAGS = 0x40000000, 0x08000000 | 0x00020000 | 0x20000000  # IPC, mount, PID


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (all checked at construction)."""

    wall_time_s: float = 10.0
    """Wall-clock seconds before every process of the run is killed."""
    cpu_time_s: int = 10
    """CPU seconds (RLIMIT_CPU): SIGXCPU, then SIGKILL one second later."""
    memory_mb: int = 1024
    """Address space per process (RLIMIT_AS; beyond it, MemoryError in the program), and the
    memory of the whole run where cgroups allow (``isolation().memory``)."""
    file_size_mb: float = 1.0
    """Largest file the program may write, stdout and stderr included (RLIMIT_FSIZE, SIGXFSZ)."""
    max_processes: int = 8
    """RLIMIT_NPROC: processes and threads of the run's user id (the program itself counts;
    without root, so does the run's init in its user namespace, and without namespaces every
    process of the trainer's user)."""
    max_open_files: int = 64
    max_output_chars: int = 20_000
    """How much of stdout and of stderr the result keeps (the start of each)."""
    network: str = "auto"
    """auto: a network namespace where possible, else the host's network (noted in results);
    isolate: refuse to run without one; host: no namespace."""
    tmp_size_mb: float = 16.0
    """The run's private /tmp, /dev/shm, /var/tmp and /run/lock together (a tmpfs)."""
    hidden_paths: tuple[str, ...] = ()
    """Paths the run must not read (test data), besides site-packages and the trainer's home."""
    uid_base: int = 1_900_000_000
    """First user id handed to concurrent runs when the trainer is root."""
    python: str | None = None
    """The interpreter the programs run with. None: this one, or (when runs drop to their own
    user id and cannot reach it, e.g. under /root) the first every user can run of
    /usr/bin/python3 and /usr/local/bin/python3. Programs use only its standard library."""

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s", "memory_mb", "file_size_mb", "tmp_size_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"SandboxLimits.{name} must be a positive number, got {value!r}.")
        for name in ("cpu_time_s", "max_processes", "max_open_files", "max_output_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxLimits.{name} must be an int >= 1, got {value!r}.")
        if self.max_open_files < 16:
            raise ValueError(
                f"SandboxLimits.max_open_files={self.max_open_files} is below the 16 a Python "
                "interpreter needs to start; use at least 16."
            )
        if self.memory_mb < 64:
            raise ValueError(
                f"SandboxLimits.memory_mb={self.memory_mb} is below the 64 MB a Python "
                "interpreter needs to start; use at least 64."
            )
        if self.network not in NETWORK_MODES:
            raise ValueError(
                f"SandboxLimits.network must be one of {NETWORK_MODES}, got {self.network!r}."
            )
        if not isinstance(self.hidden_paths, tuple) or not all(
            isinstance(p, str) and os.path.isabs(p) for p in self.hidden_paths
        ):
            raise ValueError(
                "SandboxLimits.hidden_paths must be a tuple of absolute paths, got "
                f"{self.hidden_paths!r}."
            )
        self._check_ids()

    def _check_ids(self) -> None:
        if isinstance(self.uid_base, bool) or not isinstance(self.uid_base, int):
            raise ValueError(f"SandboxLimits.uid_base must be an int, got {self.uid_base!r}.")
        if self.python is not None and not (isinstance(self.python, str) and self.python):
            raise ValueError(f"SandboxLimits.python must be a path or None, got {self.python!r}.")
        if not 1000 <= self.uid_base < 2**32 - 2**16:
            raise ValueError(
                f"SandboxLimits.uid_base={self.uid_base} must leave room for the runs' user ids "
                f"between 1000 and {2**32 - 2**16}."
            )


@dataclass(frozen=True)
class Checker:
    """Trusted code that talks with the program while it runs, from outside the sandbox.

    ``modules`` are (name, source) pairs, stdlib only, executed in order in the launcher as
    modules of those names; the last one's ``run(link, payload, deadline)`` is called with a
    link to the program (``send``/``receive`` one JSON message per line over the program's fds
    3 and 4, ``stop`` to end it), this ``payload`` and the run's ``time.monotonic()`` deadline.
    What it returns (JSON data) is ``RunResult.report``."""

    modules: tuple[tuple[str, str], ...]
    payload: Any
    max_message_bytes: int = 4 << 20


@dataclass(frozen=True)
class RunResult:
    """How one program ended.

    ``status``: ``ok`` (exit 0), ``error`` (non-zero exit, e.g. an exception: see ``stderr``),
    ``timeout`` (wall clock), ``cpu_limit``, ``file_size_limit`` (wrote too much),
    ``memory_limit`` (the run's cgroup), ``killed`` (another signal), ``stopped`` (still running
    when its checker was done), ``setup_failed`` (the sandbox itself could not start).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    network_isolated: bool
    report: Any = field(default=None, compare=False)
    """What the run's ``Checker`` returned (None without one)."""

    @property
    def reason(self) -> str:
        """One line for logs: the status and the last line of stderr."""
        tail = self.stderr.strip().splitlines()[-1:] or [""]
        detail = f": {tail[0][:200]}" if tail[0] else ""
        return f"{self.status} (exit {self.returncode}){detail}"


def network_isolation() -> str:
    """``"ok"`` when programs get a network namespace here, else why not (probed once)."""
    return isolation().network


def _plan(limits: SandboxLimits) -> dict[str, Any]:
    """The namespaces and mounts a run gets, from what the probe found and ``limits``."""
    found = isolation()
    if limits.network == "isolate" and found.network != "ok":
        raise RuntimeError(
            f"SandboxLimits(network='isolate') but this machine cannot give a program a network "
            f"namespace ({found.network}); run as root or with user namespaces enabled, or "
            "use network='auto'."
        )
    net = _CLONE_NEWNET if limits.network != "host" and found.network == "ok" else 0
    private = found.namespaces == "ok"
    root = os.geteuid() == 0
    return {
        "flags": net | (_RUN_FLAGS if private else 0),
        "user_ids": None if root else [os.geteuid(), os.getegid()],
        "private": private,
        "read_only": private and found.read_only == "ok",
        "proc": private and found.proc == "ok",
    }


def run_program(
    source: str, limits: SandboxLimits | None = None, checker: Checker | None = None
) -> RunResult:
    """Run ``source`` as ``program.py`` in a fresh sandbox; see the module docstring."""
    limits = SandboxLimits() if limits is None else limits
    if not isinstance(source, str):
        raise TypeError(f"source must be a str of Python code, got {type(source).__name__}.")
    plan = _plan(limits)
    uid = host.USER_IDS.take(limits.uid_base) if os.geteuid() == 0 else None
    python = host.interpreter(limits.python, uid is not None)
    folders: list[str] = []
    cgroups: list[str] | None = None
    backstop = False
    try:
        folders = [] if plan["private"] else _host_folders(source, uid)
        cgroups = host.make_cgroup(int(limits.memory_mb * 2**20), limits.max_processes)
        config = {
            **plan,
            **_config(source, limits, checker, python),
            "uid": uid,
            "workdirs": folders,
            "cgroups": cgroups or [],
        }
        result, backstop = _launch(config, limits, bool(plan["flags"] & _CLONE_NEWNET))
    finally:
        out_of_memory = cgroups is not None and host.remove_cgroup(cgroups)
        _clean_up(uid, plan["private"] and not backstop, folders)
    if out_of_memory and result.status == "killed":
        result = dataclasses.replace(result, status="memory_limit")
    return result


def _host_folders(source: str, uid: int | None) -> list[str]:
    """Without a mount namespace: (work folder holding program.py, output folder) on the host."""
    folders = [tempfile.mkdtemp(prefix=f"cmlrl-sandbox-{n}") for n in ("", "output-")]
    program = Path(folders[0], "program.py")
    program.write_text(source, encoding="utf-8")
    if uid is not None:
        for path in (folders[0], program):
            os.chown(path, uid, uid)
    return folders


def _config(
    source: str, limits: SandboxLimits, checker: Checker | None, python: str
) -> dict[str, Any]:
    """The launcher's configuration but the plan, the user id, the folders and the cgroup."""
    return {
        "start": time.monotonic(),
        "wall_time_s": limits.wall_time_s,
        "max_output_chars": limits.max_output_chars,
        "limits": _child_limits(limits),
        "python": python,
        "env": host.clean_env("/tmp"),
        "tmp_bytes": int(limits.tmp_size_mb * 2**20),
        "hide": host.hidden_paths(python, limits.hidden_paths),
        "program": source,
        "checker": None if checker is None else _checker_config(checker),
    }


def _checker_config(checker: Checker) -> dict[str, Any]:
    return {
        "modules": [list(m) for m in checker.modules],
        "payload": checker.payload,
        "max_bytes": checker.max_message_bytes,
    }


def _child_limits(limits: SandboxLimits) -> dict[str, int]:
    return {
        "cpu_time_s": int(limits.cpu_time_s),
        "memory_bytes": int(limits.memory_mb * 2**20),
        "file_size_bytes": int(limits.file_size_mb * 2**20),
        "max_open_files": limits.max_open_files,
        "max_processes": limits.max_processes,
    }


def _launch(
    config: dict[str, Any], limits: SandboxLimits, isolated: bool
) -> tuple[RunResult, bool]:
    """Start the launcher and read its one line: (the result, whether the backstop fired)."""
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", host.CHILD, "run"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=host.clean_env(tempfile.gettempdir()),
        cwd="/",
        start_new_session=True,  # its own process group: the backstop kills all of it
    )
    backstop = False
    try:
        out, err = proc.communicate(json.dumps(config).encode(), limits.wall_time_s + _BACKSTOP_S)
    except subprocess.TimeoutExpired:
        backstop = True
        _kill_group(proc.pid)
        out, err = proc.communicate()
    _kill_group(proc.pid)  # without a PID namespace: whatever the program left in the group
    wall = time.monotonic() - start
    stderr = err.decode("utf-8", errors="replace")[-limits.max_output_chars :]
    if backstop:
        return RunResult("timeout", -signal.SIGKILL, "", stderr, wall, isolated), True
    try:
        data = json.loads(out)
    except ValueError:
        return RunResult("setup_failed", proc.returncode, "", stderr, wall, isolated), False
    code = data["returncode"]
    status = "timeout" if data["timed_out"] else "stopped" if code is None else _status(code)
    run = RunResult(status, code, data["stdout"], data["stderr"], wall, isolated, data["report"])
    return run, False


def _status(returncode: int) -> str:
    if returncode == 0:
        return "ok"
    if returncode == _SETUP_FAILED:
        return "setup_failed"
    signals = {-signal.SIGXCPU: "cpu_limit", -signal.SIGXFSZ: "file_size_limit"}
    if returncode in signals:
        return signals[returncode]
    return "killed" if returncode < 0 else "error"


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _clean_up(uid: int | None, contained: bool, folders: list[str]) -> None:
    """Hand the user id back once nothing of the run is left; remove the run's host folders."""
    if uid is not None:
        if contained or host.reap(uid):
            host.USER_IDS.give_back(uid)
        else:
            host.LOG.warning("sandbox user id %d still has processes; it is not used again", uid)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def run_programs(
    sources: Sequence[str],
    limits: SandboxLimits | None = None,
    max_workers: int | None = None,
    checkers: Sequence[Checker | None] | None = None,
) -> list[RunResult]:
    """``run_program`` on every source (with the aligned ``checkers``, if given),
    ``max_workers`` at a time (default: one per CPU core); results in the order of ``sources``."""
    limits = SandboxLimits() if limits is None else limits
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
    ):
        raise ValueError(f"max_workers must be an int >= 1 or None, got {max_workers!r}.")
    sources = list(sources)
    checks = [None] * len(sources) if checkers is None else list(checkers)
    if len(checks) != len(sources):
        raise ValueError(f"checkers has {len(checks)} entries for {len(sources)} sources.")
    if not sources:
        return []
    workers = min(len(sources), max_workers or os.cpu_count() or 1)

    def run(source: str, checker: Checker | None) -> RunResult:
        return run_program(source, limits, checker)

    if workers == 1:
        return list(map(run, sources, checks))
    with ThreadPoolExecutor(workers, thread_name_prefix="cmlrl-sandbox") as pool:
        return list(pool.map(run, sources, checks))
