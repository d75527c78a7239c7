"""What a run left, removed where it had no namespaces of its own (stdlib only, run as root).

``python -I -S -B _sandbox_reap.py UID`` kills every process of the user id UID and waits until
none is left (zombies included: they still count against the next run's process cap), then
removes the System V IPC objects UID owns or created and the entries UID owns at the top of the
world-writable folders. Exit status 0: nothing of UID is left; 1: processes remain after the
wait (the trainer then never hands the id out again). This file is run, never imported.
"""

import ctypes
import os
import shutil
import signal
import sys
import time

TYPE_CHECKING = False  # typing is not imported at run time
if TYPE_CHECKING:
    from collections.abc import Callable

FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
IPC_RMID = 0
WAIT_S = 5.0


def _kill_all(uid: int) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)  # every process of this user id but this one
        except OSError:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _uid_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _processes_left(uid: int) -> bool:
    return any(_uid_of(name) == uid for name in os.listdir("/proc") if name.isdigit())


def _remove_ipc(uid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    removers: dict[str, tuple[str, Callable[[int], int]]] = {
        "shm": ("shmid", lambda i: libc.shmctl(i, IPC_RMID, None)),
        "msg": ("msqid", lambda i: libc.msgctl(i, IPC_RMID, None)),
        "sem": ("semid", lambda i: libc.semctl(i, 0, IPC_RMID)),
    }
    for kind, (column, remove) in removers.items():
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                header, *rows = [line.split() for line in f]
        except (OSError, ValueError):
            continue
        for row in rows:
            fields = dict(zip(header, row, strict=False))
            if uid in (int(fields["uid"]), int(fields["cuid"])):
                remove(int(fields[column]))


def _remove_files(uid: int) -> None:
    for folder in FOLDERS:
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
            except OSError:
                continue


def reap(uid: int) -> bool:
    """True when nothing of ``uid`` is left running."""
    deadline = time.monotonic() + WAIT_S
    _kill_all(uid)
    while _processes_left(uid) and time.monotonic() < deadline:
        time.sleep(0.01)
        _kill_all(uid)  # a process may have forked between the kill and its death
    clean = not _processes_left(uid)
    _remove_ipc(uid)
    _remove_files(uid)
    return clean


if __name__ == "__main__":
    sys.exit(0 if reap(int(sys.argv[1])) else 1)
