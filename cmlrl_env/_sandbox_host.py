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
    """A memory bound for the whole run: a cgroup v2 ``memory.max`` or, where v2 has no memory
    controller to hand out, a cgroup v1 ``memory.limit_in_bytes`` (else the limit holds per
    process)."""


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


def _mounts(fstype: str) -> list[tuple[str, set[str]]]:
    """(mount point, super options) of every mount of ``fstype``."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            if fields[dash + 1] == fstype:
                found.append((fields[4], set(fields[dash + 3].split(","))))
    return found


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per hierarchy: ``""`` for v2, the controller names for v1."""
    own = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    return own


def _writable(folder: str) -> bool:
    return os.path.isdir(folder) and os.access(folder, os.W_OK)


@dataclass(frozen=True)
class CgroupParents:
    """Where runs get cgroups of their own: the v2 folder, or v1's memory (and pids) folders."""

    version: int
    memory: str
    pids: str | None = None


@functools.lru_cache(maxsize=1)
def cgroup_parent() -> tuple[CgroupParents | None, str]:
    """(where runs get cgroups of their own, ``"ok"``), or (None, why not).

    cgroup v2 first: this process's cgroup or its parent, whichever first hands the memory
    controller to its children and is writable (a cgroup that holds processes cannot hand out
    controllers, except the root, so runs usually go beside the trainer's own cgroup). Else
    cgroup v1: this process's memory cgroup (and pids cgroup) where it may create children."""
    if os.geteuid() != 0:
        return None, "cgroups are set up only as root"
    try:
        own, v2, v1 = _own_cgroups(), _mounts("cgroup2"), _mounts("cgroup")
    except (OSError, ValueError) as exc:
        return None, f"cgroups not readable: {exc}"
    why = []
    if v2 and "" in own:
        folders = dict.fromkeys(
            os.path.join(v2[0][0], p.lstrip("/")) for p in (own[""], os.path.dirname(own[""]))
        )
        for folder in folders:
            try:
                controllers = Path(folder, "cgroup.subtree_control").read_text().split()
            except OSError:
                continue
            if "memory" in controllers and _writable(folder):
                return CgroupParents(2, folder), "ok"
        why.append(f"cgroup v2 hands no memory controller to children of {' or '.join(folders)}")
    v1_folders = {
        name: os.path.join(mount, own[name].lstrip("/"))
        for name in ("memory", "pids")
        for mount, options in v1
        if name in options and name in own
    }
    if _writable(v1_folders.get("memory", "")):
        pids = v1_folders.get("pids")
        return CgroupParents(1, v1_folders["memory"], pids if _writable(pids or "") else None), "ok"
    why.append("no writable cgroup v1 memory hierarchy")
    return None, "; ".join(why)


_CGROUP_IDS = itertools.count()


def _limits(
    parents: CgroupParents, memory_bytes: int, max_processes: int
) -> dict[str, list[tuple[str, int]]]:
    """The files to write in each new cgroup, by parent folder, in order."""
    pids = ("pids.max", max_processes + 2)  # the launcher and init count too
    if parents.version == 2:
        return {parents.memory: [("memory.max", memory_bytes), ("memory.swap.max", 0), pids]}
    # v1: memory + swap may not exceed memory alone (no swap); memsw only where swap accounting
    # exists, and after limit_in_bytes (it must never be below it).
    memory = [
        ("memory.limit_in_bytes", memory_bytes),
        ("memory.memsw.limit_in_bytes", memory_bytes),
    ]
    return {parents.memory: memory, **({parents.pids: [pids]} if parents.pids else {})}


def make_cgroup(memory_bytes: int, max_processes: int) -> list[str] | None:
    """Fresh cgroups (one per hierarchy) holding the run to ``memory_bytes`` (no swap), or None
    where none can be; the run's launcher joins each."""
    parents = cgroup_parent()[0]
    if parents is None:
        return None
    name = f"cmlrl-sandbox-{os.getpid()}-{next(_CGROUP_IDS)}"
    made: list[str] = []
    try:
        for parent, files in _limits(parents, memory_bytes, max_processes).items():
            path = os.path.join(parent, name)
            os.mkdir(path)
            made.append(path)
            for file, value in files:
                if os.path.exists(os.path.join(path, file)):
                    Path(path, file).write_text(f"{value}\n")
    except OSError as exc:
        LOG.warning("the run gets no cgroup of its own (%s): its memory limit is per process", exc)
        remove_cgroup(made)
        return None
    return made


def _oom_kills(path: str) -> int:
    """Processes the cgroup's memory limit ended (v2 ``memory.events``, v1 ``oom_control``)."""
    for file in ("memory.events", "memory.oom_control"):
        try:
            words = Path(path, file).read_text().split()
            return int(words[words.index("oom_kill") + 1])
        except (OSError, ValueError, IndexError):
            continue
    return 0


def remove_cgroup(paths: list[str]) -> bool:
    """Remove a run's cgroups; True when its memory limit ended a process of the run."""
    killed = any(_oom_kills(path) > 0 for path in paths)
    for path in paths:
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
