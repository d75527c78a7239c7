"""The Linux calls of the sandbox's launcher (stdlib only): namespaces, mounts, limits.

Used by ``_sandbox_child.py`` in the launcher process; never imported by the trainer's packages.
"""

from __future__ import annotations

import ctypes
import os
import resource

TYPE_CHECKING = False  # typing is not imported at run time: the launcher starts every program
if TYPE_CHECKING:
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_NO_NEW_PRIVS = 1, 4, 38
SYS_MOUNT_SETATTR = 442  # the same number on every architecture (new syscalls share numbers)
AT_FDCWD, AT_RECURSIVE, MOUNT_ATTR_RDONLY = -100, 0x8000, 1
RUN_UID = 1000
"""The run's user id inside a user namespace: not 0, so the program has no capabilities."""
SHARED_FOLDERS = ("/dev/shm", "/var/tmp", "/run/lock")
"""World-writable folders besides /tmp: each gets a folder of the run's one tmpfs."""

_LIBC = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("set", "clear", "propagation", "userns_fd")]


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what} failed: {os.strerror(errno)}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def prctl(option: int, value: int) -> None:
    _check(_LIBC.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    args = (_bytes(source), target.encode(), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data))
    _check(_LIBC.mount(*args), f"mount {target}")


def _read_only_everywhere() -> None:
    """Every mount read-only (and private) in this mount namespace, recursively."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY, 0, MS_PRIVATE, 0)
    size = ctypes.c_size_t(ctypes.sizeof(attr))
    call = (SYS_MOUNT_SETATTR, AT_FDCWD, b"/", ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr))
    _check(_LIBC.syscall(*call, size), "mount_setattr(read-only)")


def enter_namespaces(flags: int, user_ids: list[int] | None) -> None:
    """``unshare(flags)``; with ``user_ids`` (trainer uid, gid) also a user namespace in which
    the process is ``RUN_UID`` and holds the capabilities to set up the others."""
    if not flags:
        return
    if user_ids is not None:
        flags |= CLONE_NEWUSER
    _check(_LIBC.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")
    if user_ids is not None:
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{RUN_UID} {user_ids[0]} 1"),
            ("gid_map", f"{RUN_UID} {user_ids[1]} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)


def _shared_folders() -> None:
    for folder in SHARED_FOLDERS:
        if os.path.isdir(folder):
            inside = "/tmp/." + folder.strip("/").replace("/", "-")
            os.mkdir(inside)
            os.chmod(inside, 0o1777)
            mount(inside, folder, None, MS_BIND)


def _hide(paths: list[str]) -> None:
    for path in paths:
        if os.path.isdir(path):
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,mode=0")
        elif os.path.exists(path):
            mount("/dev/null", path, None, MS_BIND)


def private_files(config: dict[str, Any]) -> tuple[str, str]:
    """In a new mount namespace: the run's private files; (work folder, output folder).

    Mounts become private (nothing propagates to the host) and, when ``read_only``, read-only;
    /tmp becomes a tmpfs of ``tmp_bytes`` shared with the other world-writable folders; the
    ``hide`` paths are covered; the work folder holds ``program.py``, owned by ``uid``."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    if config["read_only"]:
        _read_only_everywhere()
    options = f"size={int(config['tmp_bytes'])},nr_inodes=4096,mode=1777"
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, options)
    _shared_folders()
    _hide(config["hide"])
    workdir, outdir = f"/tmp/cmlrl-sandbox-{os.urandom(6).hex()}", "/tmp/.cmlrl-output"
    os.mkdir(workdir, 0o700)
    os.mkdir(outdir, 0o700)
    # stdout and stderr on a tmpfs of their own: a program that fills /tmp still prints
    output_bytes = 2 * int(config["limits"]["file_size_bytes"]) + (1 << 16)
    mount("tmpfs", outdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={output_bytes},mode=0700")
    program = os.path.join(workdir, "program.py")
    with open(program, "w", encoding="utf-8") as f:
        f.write(config["program"])
    if config["uid"] is not None:
        for path in (workdir, program):
            os.chown(path, config["uid"], config["uid"])
    return workdir, outdir


def set_limits(limits: dict[str, Any]) -> None:
    """The program's resource limits (kept across ``exec``)."""
    cpu = int(limits["cpu_time_s"])
    # CPU: SIGXCPU at the soft limit, SIGKILL one second later if the program ignores it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    for which, key in (
        (resource.RLIMIT_AS, "memory_bytes"),
        (resource.RLIMIT_FSIZE, "file_size_bytes"),
        (resource.RLIMIT_NOFILE, "max_open_files"),
        (resource.RLIMIT_NPROC, "max_processes"),
        (resource.RLIMIT_CORE, None),
    ):
        value = 0 if key is None else int(limits[key])
        resource.setrlimit(which, (value, value))
