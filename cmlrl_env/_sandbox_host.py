"""The trainer's side of the sandbox: what this machine allows, user ids, cgroups, clean-up.

Used by ``cmlrl_env.sandbox``; the launcher (``_sandbox_child.py``) runs in its own process.
"""

from __future__ import annotations

import fcntl
import functools
import itertools
import json
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

LOG = logging.getLogger("cmlrl_env.sandbox")
HERE = Path(__file__).parent
CHILD = str(HERE / "_sandbox_child.py")
REAP = str(HERE / "_sandbox_reap.py")


def clean_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}


@dataclass(frozen=True)
class Isolation:
    """What this machine gives a run: each field is ``"ok"`` or why not."""

    network: str
    """A network namespace: no network, only a loopback that is down."""
    namespaces: str
    """IPC, mount and PID namespaces: private /tmp and /dev/shm, IPC objects and every process
    of the run gone with it; without root, through a user namespace."""
    read_only: str
    """Every mount read-only for the run (only its private tmpfs is writable)."""
    proc: str
    """A /proc that shows only the run's own processes."""
    memory: str
    """A cgroup v2 ``memory.max`` for the whole run (else the limit holds per process)."""


@functools.lru_cache(maxsize=1)
def isolation() -> Isolation:
    """What runs get on this machine (probed once per process)."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-B", CHILD, "probe"],
        capture_output=True,
        text=True,
        env=clean_env(tempfile.gettempdir()),
        timeout=60,
        check=False,
    )
    try:
        found = {k: str(v) for k, v in json.loads(done.stdout).items()}
    except ValueError:
        reason = f"probe failed: {done.stderr.strip()[-200:]}"
        found = dict.fromkeys(("network", "namespaces", "read_only", "proc"), reason)
    return Isolation(memory=cgroup_parent()[1], **found)


def _cgroup2_mount() -> str | None:
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                return fields[4]
    return None


@functools.lru_cache(maxsize=1)
def cgroup_parent() -> tuple[str | None, str]:
    """(the cgroup v2 folder where runs get cgroups of their own, ``"ok"``), or (None, why not).

    That is this process's cgroup or its parent, whichever first hands the memory controller to
    its children and is writable: a cgroup that holds processes cannot hand out controllers
    (except the root), so runs usually go beside the trainer's own cgroup."""
    if os.geteuid() != 0:
        return None, "cgroups are set up only as root"
    try:
        mount = _cgroup2_mount()
        with open("/proc/self/cgroup") as f:
            own = next((line[3:].strip() for line in f if line.startswith("0::")), None)
    except (OSError, ValueError, IndexError) as exc:
        return None, f"cgroup v2 not readable: {exc}"
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy is mounted"
    folders = dict.fromkeys(os.path.join(mount, p.lstrip("/")) for p in (own, os.path.dirname(own)))
    for folder in folders:
        try:
            controllers = Path(folder, "cgroup.subtree_control").read_text().split()
        except OSError:
            continue
        if "memory" in controllers and os.access(folder, os.W_OK):
            return folder, "ok"
    return None, f"no memory controller handed to child cgroups of {' or '.join(folders)}"


_CGROUP_IDS = itertools.count()


def make_cgroup(memory_bytes: int, max_processes: int) -> str | None:
    """A fresh cgroup holding the run to ``memory_bytes`` (no swap), or None where none can be."""
    parent = cgroup_parent()[0]
    if parent is None:
        return None
    path = os.path.join(parent, f"cmlrl-sandbox-{os.getpid()}-{next(_CGROUP_IDS)}")
    try:
        os.mkdir(path)
        for name, value in (
            ("memory.max", memory_bytes),
            ("memory.swap.max", 0),
            ("pids.max", max_processes + 2),  # the launcher and init count too
        ):
            if os.path.exists(os.path.join(path, name)):
                Path(path, name).write_text(f"{value}\n")
    except OSError as exc:
        LOG.warning("the run gets no cgroup of its own (%s): its memory limit is per process", exc)
        if os.path.isdir(path):
            remove_cgroup(path)
        return None
    return path


def remove_cgroup(path: str) -> bool:
    """Remove a run's cgroup; True when its memory limit ended a process of the run."""
    try:
        events = Path(path, "memory.events").read_text().split()
        killed = int(events[events.index("oom_kill") + 1]) > 0
    except (OSError, ValueError):
        killed = False
    try:
        os.rmdir(path)
    except OSError as exc:
        LOG.warning("could not remove the sandbox's cgroup %s: %s", path, exc)
    return killed


class UserIds:
    """User ids of the runs in progress (root only): never two runs under the same id, in this
    process or in any other on the machine (two trainers, the ranks of a torchrun launch). An id
    is held by an exclusive ``flock`` on its lock file, which the kernel drops if the process
    dies. An id is handed back only once nothing of its run is left; one whose processes could
    not be ended is retired (held until this process exits)."""

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


USER_IDS = UserIds()


def reap(uid: int) -> bool:
    """Kill what ``uid`` left running and remove its IPC objects and shared files (root, for
    runs without namespaces of their own); True once none of its processes is left."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-B", REAP, str(uid)],
        env=clean_env(tempfile.gettempdir()),
        capture_output=True,
        timeout=60,
        check=False,
    )
    return done.returncode == 0


def _world_executable(path: str) -> bool:
    """Every user may run ``path``: o+x on the file and on every folder above it."""
    target = Path(os.path.realpath(path))
    if not target.is_file():
        return False
    return all(os.stat(p).st_mode & 0o001 for p in (target, *target.parents))


def interpreter(python: str | None, dropping_user: bool) -> str:
    """The interpreter programs run with (see ``SandboxLimits.python``)."""
    if python is not None:
        return python
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


@functools.lru_cache(maxsize=8)
def hidden_paths(python: str, extra: tuple[str, ...]) -> list[str]:
    """What the run must not read: the trainer's site-packages (its datasets, its packages),
    its home and ``extra``; never a folder that holds the run's interpreter, or the launcher's
    interpreter and standard library (the checker imports from it)."""
    paths = sysconfig.get_paths()
    home = os.path.expanduser("~")
    wanted = [paths["purelib"], paths["platlib"], *([home] if home != "/" else []), *extra]
    needed = (python, sys.executable, paths["stdlib"], paths["platstdlib"])
    keep = {Path(f(p)) for p in needed for f in (os.path.abspath, os.path.realpath)}
    found = []
    for path in dict.fromkeys(os.path.realpath(p) for p in wanted):
        if not any(k.is_relative_to(path) for k in keep) and os.path.exists(path):
            found.append(path)
    return found
