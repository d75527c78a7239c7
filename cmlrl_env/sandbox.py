"""Run untrusted Python (model-written code) in separate, limited processes.

Each program runs in its own process: a fresh temporary working folder (deleted afterwards),
Python's isolated mode without site-packages (``python -I -S -B``), an environment holding only
``PATH``, ``HOME``, ``TMPDIR`` and ``LANG`` (none of the trainer's variables: no tokens, no keys),
and resource limits set with ``resource.setrlimit``: CPU seconds, address space, the size of any
file written (stdout and stderr included), open files and processes. A wall-clock limit kills the
whole process group. Where the OS allows, the program gets a new network namespace (no network,
only a loopback that is down). Started as root, each concurrent run also gets a user id of its own
(from ``uid_base``), so it cannot read the trainer's private files, write outside world-writable
folders, or signal other processes, and the process cap counts only its own processes; whatever
it left running is killed after the run.

What is not isolated: without root the program runs as the trainer's user (it can read and write
that user's files and signal its processes; the process cap counts all of that user's
processes), and without namespace support it has the host's network. The file system is never
hidden: world-readable files can be read, world-writable folders (``/tmp``) written, within the
file-size limit. ``network_isolation()`` says what this machine gives. For stronger isolation run
the trainer in a container.

``run_programs(sources, limits)`` runs a batch in parallel (one thread waits per process); a hung
or crashing program costs its own time limit and ends as a ``RunResult`` with a reason, never as
an exception in the trainer.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SandboxLimits", "RunResult", "network_isolation", "run_program", "run_programs"]

_CHILD = str(Path(__file__).with_name("_sandbox_child.py"))
_SETUP_FAILED = 111  # _sandbox_child.SETUP_FAILED
NETWORK_MODES = ("auto", "isolate", "host")


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run (all checked at construction)."""

    wall_time_s: float = 10.0
    """Wall-clock seconds before the process group is killed (a sleeping program ends here)."""
    cpu_time_s: int = 10
    """CPU seconds (RLIMIT_CPU): SIGXCPU, then SIGKILL one second later."""
    memory_mb: int = 1024
    """Address space (RLIMIT_AS); an allocation beyond it raises MemoryError in the program."""
    file_size_mb: float = 1.0
    """Largest file the program may write, stdout and stderr included (RLIMIT_FSIZE, SIGXFSZ)."""
    max_processes: int = 8
    """RLIMIT_NPROC: processes and threads of the run's user id (the program itself counts)."""
    max_open_files: int = 64
    max_output_chars: int = 20_000
    """How much of stdout and of stderr the result keeps (the start of each)."""
    network: str = "auto"
    """auto: a network namespace where possible, else the host's network (noted in results);
    isolate: refuse to run without one; host: no namespace."""
    uid_base: int = 1_900_000_000
    """First user id handed to concurrent runs when the trainer is root."""
    python: str | None = None
    """The interpreter the programs run with. None: this one, or (when runs drop to their own
    user id and cannot reach it, e.g. under /root) the first every user can run of
    /usr/bin/python3 and /usr/local/bin/python3. Programs use only its standard library."""

    def __post_init__(self) -> None:
        for name in ("wall_time_s", "cpu_time_s", "memory_mb", "file_size_mb"):
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
class RunResult:
    """How one program ended.

    ``status``: ``ok`` (exit 0), ``error`` (non-zero exit, e.g. an exception: see ``stderr``),
    ``timeout`` (wall clock), ``cpu_limit``, ``file_size_limit`` (wrote too much),
    ``killed`` (another signal), ``setup_failed`` (the sandbox itself could not start).
    """

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    network_isolated: bool

    @property
    def reason(self) -> str:
        """One line for logs: the status and the last line of stderr."""
        tail = self.stderr.strip().splitlines()[-1:] or [""]
        detail = f": {tail[0][:200]}" if tail[0] else ""
        return f"{self.status} (exit {self.returncode}){detail}"


@functools.lru_cache(maxsize=1)
def network_isolation() -> str:
    """``"ok"`` when programs get a network namespace here, else why not (probed once)."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-B", _CHILD, "probe", "-"],
        capture_output=True,
        text=True,
        env=_clean_env(tempfile.gettempdir()),
        timeout=30,
        check=False,
    )
    try:
        return str(json.loads(done.stdout)["network"])
    except (ValueError, KeyError):
        return f"probe failed: {done.stderr.strip()[-200:]}"


class _UserIds:
    """User ids of the runs in progress (root only): never two runs under the same id, in this
    process or in any other on the machine (two trainers, the ranks of a torchrun launch). An id
    is held by an exclusive ``flock`` on its lock file, which the kernel drops if the process
    dies; without it, one process's reap of "its" id killed another's running program."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[int, int] = {}  # user id -> the descriptor holding its lock

    def take(self, base: int) -> int:
        folder = Path(tempfile.gettempdir(), "cmlrl-sandbox-uids")
        folder.mkdir(mode=0o700, exist_ok=True)
        with self._lock:
            for uid in range(base, base + 2**16):
                if uid in self._held:
                    continue
                fd = os.open(folder / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)  # another process runs a program under this id
                    continue
                self._held[uid] = fd
                return uid
        raise RuntimeError(
            f"all 65536 sandbox user ids from uid_base={base} are in use; let runs finish or "
            "set SandboxLimits(uid_base=...) to another range."
        )

    def give_back(self, uid: int) -> None:
        with self._lock:
            os.close(self._held.pop(uid))


_USER_IDS = _UserIds()


def _clean_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}


def _use_network_namespace(limits: SandboxLimits) -> bool:
    if limits.network == "host":
        return False
    available = network_isolation() == "ok"
    if limits.network == "isolate" and not available:
        raise RuntimeError(
            f"SandboxLimits(network='isolate') but this machine cannot give a program a network "
            f"namespace ({network_isolation()}); run as root or with user namespaces enabled, or "
            "use network='auto'."
        )
    return available


def run_program(source: str, limits: SandboxLimits | None = None) -> RunResult:
    """Run ``source`` as ``program.py`` in a fresh sandbox; see the module docstring."""
    limits = SandboxLimits() if limits is None else limits
    if not isinstance(source, str):
        raise TypeError(f"source must be a str of Python code, got {type(source).__name__}.")
    isolated = _use_network_namespace(limits)
    uid = _USER_IDS.take(limits.uid_base) if os.geteuid() == 0 else None
    workdir = tempfile.mkdtemp(prefix="cmlrl-sandbox-")
    iodir = tempfile.mkdtemp(prefix="cmlrl-sandbox-io-")
    try:
        Path(workdir, "program.py").write_text(source, encoding="utf-8")
        config = {
            "network": isolated,
            "limits": _child_limits(limits),
            "uid": uid,
            "workdir": workdir,
            "python": _interpreter(limits, uid is not None),
            "env": _clean_env(workdir),
        }
        return _run(config, limits, Path(iodir), isolated)
    finally:
        if uid is not None:
            _reap(uid)
            _USER_IDS.give_back(uid)
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.rmtree(iodir, ignore_errors=True)


def _world_executable(path: str) -> bool:
    """Every user may run ``path``: o+x on the file and on every folder above it."""
    target = Path(os.path.realpath(path))
    if not target.is_file():
        return False
    return all(os.stat(p).st_mode & 0o001 for p in (target, *target.parents))


def _interpreter(limits: SandboxLimits, dropping_user: bool) -> str:
    if limits.python is not None:
        return limits.python
    if not dropping_user:
        return sys.executable
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if _world_executable(candidate):
            return candidate
    raise RuntimeError(
        f"the sandbox runs programs under their own user id, which cannot run "
        f"{sys.executable} (a folder above it is private) and no /usr/bin/python3 exists; "
        "install one or pass SandboxLimits(python='/path/every/user/can/run')."
    )


def _child_limits(limits: SandboxLimits) -> dict[str, int]:
    return {
        "cpu_time_s": int(limits.cpu_time_s),
        "memory_bytes": int(limits.memory_mb * 2**20),
        "file_size_bytes": int(limits.file_size_mb * 2**20),
        "max_open_files": limits.max_open_files,
        "max_processes": limits.max_processes,
    }


def _run(config: dict, limits: SandboxLimits, iodir: Path, isolated: bool) -> RunResult:
    start = time.monotonic()
    # Output goes to files, not pipes: RLIMIT_FSIZE bounds them, and nothing is buffered here.
    with open(iodir / "stdout", "wb") as out, open(iodir / "stderr", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", _CHILD, "run", json.dumps(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            env=config["env"],
            cwd=config["workdir"],
            start_new_session=True,  # its own process group: the timeout kills all of it
        )
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_time_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            proc.wait()
        _kill_group(proc.pid)  # children that outlived the program
    wall = time.monotonic() - start
    keep = limits.max_output_chars
    stdout = _read_start(iodir / "stdout", keep)
    stderr = _read_start(iodir / "stderr", keep)
    status = _status(proc.returncode, timed_out)
    return RunResult(status, proc.returncode, stdout, stderr, wall, isolated)


def _status(returncode: int, timed_out: bool) -> str:
    if timed_out:
        return "timeout"
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


def _reap(uid: int) -> None:
    subprocess.run(
        [sys.executable, "-I", "-S", "-B", _CHILD, "reap", str(uid)],
        env=_clean_env(tempfile.gettempdir()),
        capture_output=True,
        timeout=30,
        check=False,
    )


def _read_start(path: Path, chars: int) -> str:
    with open(path, "rb") as f:
        data = f.read(chars * 4)  # UTF-8: at most 4 bytes per character
    return data.decode("utf-8", errors="replace")[:chars]


def run_programs(
    sources: Sequence[str], limits: SandboxLimits | None = None, max_workers: int | None = None
) -> list[RunResult]:
    """``run_program`` on every source, ``max_workers`` at a time (default: one per CPU core);
    results in the order of ``sources``."""
    limits = SandboxLimits() if limits is None else limits
    if max_workers is not None and (
        isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1
    ):
        raise ValueError(f"max_workers must be an int >= 1 or None, got {max_workers!r}.")
    sources = list(sources)
    if not sources:
        return []
    workers = min(len(sources), max_workers or os.cpu_count() or 1)
    if workers == 1:
        return [run_program(s, limits) for s in sources]
    with ThreadPoolExecutor(workers, thread_name_prefix="cmlrl-sandbox") as pool:
        return list(pool.map(functools.partial(run_program, limits=limits), sources))
