"""The sandbox's launcher: run as ``python -I -S -B _sandbox_child.py MODE JSON`` (stdlib only).

MODE ``run``: leave the network (a new network namespace), set the resource limits, drop to the
run's own user id when started as root, enter the work folder and ``exec`` a fresh isolated
interpreter on ``program.py``; the limits, the namespace and the user id survive the ``exec``.
MODE ``probe``: print whether a network namespace can be made here. MODE ``reap``: as the run's
user id, kill every process left with that id (children that left the process group).

It runs in the child process and never imports the parent's packages: a file, not a module.
"""

import ctypes
import ctypes.util
import json
import os
import resource
import signal
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SETUP_FAILED = 111  # the exit status that tells the parent the sandbox could not be set up


def _unshare_network() -> str:
    """Enter a new network namespace (only a down loopback); '' on success, else the reason."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    # Root may make a network namespace directly; other users need a user namespace with it.
    flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        return f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}"
    return ""


def _limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def _set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_time_s"])
    # CPU: SIGXCPU at the soft limit, SIGKILL one second later if the program ignores it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    _limit(resource.RLIMIT_AS, int(limits["memory_bytes"]))
    _limit(resource.RLIMIT_FSIZE, int(limits["file_size_bytes"]))
    _limit(resource.RLIMIT_NOFILE, int(limits["max_open_files"]))
    _limit(resource.RLIMIT_NPROC, int(limits["max_processes"]))
    _limit(resource.RLIMIT_CORE, 0)


def _drop_privileges(uid: int, workdir: str) -> None:
    for name in [workdir, *(os.path.join(workdir, n) for n in os.listdir(workdir))]:
        os.chown(name, uid, uid)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _fail(message: str) -> None:
    sys.stderr.write(f"cmlrl-sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def run(config: dict) -> None:
    if config["network"]:
        reason = _unshare_network()
        if reason:
            _fail(reason)
    try:
        _set_limits(config["limits"])
        if config["uid"] is not None:
            _drop_privileges(int(config["uid"]), config["workdir"])
        os.chdir(config["workdir"])
    except OSError as exc:
        _fail(f"setting up the sandbox failed: {exc}")
    python = config["python"]
    # -I: no PYTHON* variables, no user site, script folder not on sys.path; -S: no site-packages.
    os.execve(python, [python, "-I", "-S", "-B", "program.py"], config["env"])


def probe() -> None:
    print(json.dumps({"network": _unshare_network() or "ok"}))


def reap(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    try:
        os.kill(-1, signal.SIGKILL)  # every process of this user id but this one
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    mode, argument = sys.argv[1], sys.argv[2]
    if mode == "run":
        run(json.loads(argument))
    elif mode == "probe":
        probe()
    elif mode == "reap":
        reap(int(argument))
    else:
        _fail(f"unknown mode {mode!r}")
