"""The sandbox's launcher, run as ``python -I -S -B _sandbox_child.py MODE`` (stdlib only).

MODE ``run`` reads its configuration as JSON on stdin (never from its arguments, which any
process may read in /proc) and then:

1. enters the namespaces the trainer's probe found: network (a loopback that is down), and
   where possible IPC (System V objects and POSIX queues die with the run), mount and PID;
   without root also a user namespace, where the run is user 1000 (the trainer's user outside);
2. makes itself undumpable: no process without privileges may trace it or read its memory;
3. with a mount namespace: every mount read-only for the run, one small tmpfs on /tmp whose
   folders are also mounted on /dev/shm, /var/tmp and /run/lock (one size limit for all), an
   empty folder over each hidden path, and a /proc that shows only the run's processes;
4. forks the run's init (PID 1 of the new PID namespace), which forks the program: limits
   set, the run's own user id, no new privileges, ``python -I -S -B program.py``; init reports
   the program's end and exits, and with it the kernel kills whatever the program left;
5. runs the trusted checker meanwhile, if given: it talks with the program over the program's
   fds 3 and 4 (``Link``); otherwise waits for the program, up to the wall-clock limit;
6. prints one JSON line: how the program ended, the start of its output, the checker's report.

MODE ``probe`` prints which of these this machine allows. This file is run, never imported.
"""

import fcntl
import json
import os
import select
import signal
import sys
import time

TYPE_CHECKING = False  # typing is not imported at run time: this file starts every program
if TYPE_CHECKING:
    import types
    from collections.abc import Callable
    from typing import Any

sys.path.append(os.path.dirname(os.path.abspath(__file__)))  # -I left it out; stdlib first
from _sandbox_sys import (  # noqa: E402
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_PDEATHSIG,
    enter_namespaces,
    mount,
    prctl,
    private_files,
    set_limits,
)

SETUP_FAILED = 111  # the exit status that tells the parent the sandbox could not be set up
RUN_FLAGS = CLONE_NEWIPC | CLONE_NEWNS | CLONE_NEWPID  # the network namespace goes apart


class Link:
    """The checker's end of the pipes to the program: one JSON message per line."""

    def __init__(self, to_program: int, from_program: int, max_bytes: int, init: int) -> None:
        self._out, self._in, self._max, self._init = to_program, from_program, max_bytes, init
        self._buffer = b""
        self.closed = False

    def send(self, message: object) -> None:
        data = memoryview(json.dumps(message).encode() + b"\n")
        try:
            while data:
                data = data[os.write(self._out, data) :]
        except BrokenPipeError:
            self.closed = True
            raise EOFError("the program ended") from None

    def receive(self) -> object:
        """The next message; EOFError once the program is gone, ValueError for garbage."""
        while b"\n" not in self._buffer:
            if len(self._buffer) > self._max:
                raise ValueError(f"a message longer than {self._max} bytes")
            chunk = os.read(self._in, 1 << 16)
            if not chunk:
                self.closed = True
                raise EOFError("the program ended")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        if len(line) > self._max:
            raise ValueError(f"a message longer than {self._max} bytes")
        try:
            return json.loads(line)
        except RecursionError:
            raise ValueError("a message nested too deeply") from None

    def stop(self) -> None:
        """End the program (and, in a PID namespace, every process of the run) now."""
        os.kill(self._init, signal.SIGKILL)


def _load_checker(spec: "dict[str, Any] | None") -> "types.ModuleType | None":
    """The checker's module, built from the sources the trainer sent (before the program runs)."""
    if spec is None:
        return None
    import types

    module = None
    for name, source in spec["modules"]:
        parts = name.split(".")
        for i in range(1, len(parts)):  # empty parent packages, so plain imports resolve
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def _fail(message: str) -> None:
    sys.stderr.write(f"cmlrl-sandbox: {message}\n")
    sys.stderr.flush()
    os._exit(SETUP_FAILED)


def _exec_program(config: "dict[str, Any]", fds: list[int], workdir: str) -> None:
    """In the program's process: its descriptors, limits and user id, then the interpreter."""
    try:
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in fds]
        for target, fd in enumerate(high):
            os.dup2(fd, target)
        os.closerange(len(high), 1 << 16)
        set_limits(config["limits"])
        if config["uid"] is not None:
            os.setgroups([])
            os.setgid(config["uid"])
            os.setuid(config["uid"])
        prctl(PR_SET_NO_NEW_PRIVS, 1)  # no setuid program can give the run privileges
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.chdir(workdir)
        env = dict(config["env"], HOME=workdir, TMPDIR=workdir)
        python = config["python"]
        os.execve(python, [python, "-I", "-S", "-B", "program.py"], env)
    except BaseException as exc:
        os.write(2, f"cmlrl-sandbox: starting the program failed: {exc}\n".encode())
    os._exit(SETUP_FAILED)


def _init(config: "dict[str, Any]", fds: list[int], workdir: str, status: int) -> None:
    """The run's init: start the program, wait for it, report its end, exit (killing the rest)."""
    message: dict[str, Any] = {"error": "init failed"}
    try:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if config["proc"]:
            mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        pid = os.fork()
        if pid == 0:
            _exec_program(config, fds, workdir)
        for fd in fds:
            os.close(fd)  # the checker sees the end of the pipe when the program ends
        while True:  # as PID 1, orphans of the program are reaped here too
            reaped, wait_status = os.waitpid(-1, 0)
            if reaped == pid:
                message = {"returncode": os.waitstatus_to_exitcode(wait_status)}
                break
    except BaseException as exc:
        message = {"error": f"init failed: {exc}"}
    finally:
        os.write(status, json.dumps(message).encode())
        os._exit(0)


def _open_files(outdir: str, checker: bool) -> tuple[list[int], list[int]]:
    """(the program's fds 0.. in order, the launcher's ends of the checker's pipes)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fds = [os.open("/dev/null", os.O_RDONLY)]
    fds += [os.open(os.path.join(outdir, n), flags, 0o600) for n in ("stdout", "stderr")]
    if not checker:
        return fds, []
    requests_r, requests_w = os.pipe()
    answers_r, answers_w = os.pipe()
    return [*fds, requests_r, answers_w], [requests_w, answers_r]


def _ended(status: int, timeout: float) -> bool:
    return bool(select.select([status], [], [], max(timeout, 0.0))[0])


def _supervise(
    config: "dict[str, Any]",
    checker: "types.ModuleType | None",
    init: int,
    ends: list[int],
    status: int,
) -> "dict[str, Any]":
    """Run the checker (or wait) until the program ends or the wall clock runs out."""
    deadline = config["start"] + config["wall_time_s"]
    out: dict[str, Any] = {"timed_out": False, "report": None, "returncode": None}
    if checker is not None:
        link = Link(ends[0], ends[1], config["checker"]["max_bytes"], init)
        try:
            out["report"] = checker.run(link, config["checker"]["payload"], deadline)
        except Exception as exc:  # the checker's own failure (the test code's), not the program's
            out["report"] = {"checker_error": f"{type(exc).__name__}: {exc}"[:300]}
        out["timed_out"] = time.monotonic() >= deadline
        ended = _ended(status, 1.0 if link.closed else 0.0)  # a program that ended: why?
    else:
        ended = _ended(status, deadline - time.monotonic())
        out["timed_out"] = not ended
    os.kill(init, signal.SIGKILL)
    os.waitpid(init, 0)  # in a PID namespace: returns once every process of the run is gone
    if ended:
        message = json.loads(os.read(status, 1 << 16) or b"{}")
        if "error" in message:
            _fail(message["error"])
        out["returncode"] = message.get("returncode")
    elif checker is None:
        out["returncode"] = -signal.SIGKILL
    return out


def _read_start(path: str, chars: int) -> str:
    with open(path, "rb") as f:
        return f.read(chars * 4).decode("utf-8", errors="replace")[:chars]


def run(config: "dict[str, Any]") -> None:
    try:
        for cgroup in config["cgroups"]:  # before the mounts turn read-only; children inherit
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write("0\n")
        checker = _load_checker(config["checker"])
        enter_namespaces(config["flags"], config["user_ids"])
        prctl(PR_SET_DUMPABLE, 0)  # after the user namespace's maps, which need it dumpable
        workdir, outdir = private_files(config) if config["private"] else config["workdirs"]
        fds, ends = _open_files(outdir, checker is not None)
    except OSError as exc:
        _fail(f"setting up the sandbox failed: {exc}")
    status_r, status_w = os.pipe()
    init = os.fork()
    if init == 0:
        for fd in (status_r, *ends):
            os.close(fd)
        _init(config, fds, workdir, status_w)
    for fd in (status_w, *fds):
        os.close(fd)
    out = _supervise(config, checker, init, ends, status_r)
    chars = config["max_output_chars"]
    out["stdout"] = _read_start(os.path.join(outdir, "stdout"), chars)
    out["stderr"] = _read_start(os.path.join(outdir, "stderr"), chars)
    sys.stdout.write(json.dumps(out) + "\n")


def _attempt(step: "Callable[[], object]") -> str:
    """'ok' when ``step()`` works in a child process of its own, else why not."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            step()
            os.write(writer, b"ok")
        except BaseException as exc:
            os.write(writer, str(exc).encode()[:300])
        os._exit(0)
    os.close(writer)
    os.waitpid(pid, 0)
    return os.read(reader, 512).decode() or "the probe died"


def probe() -> None:
    user = [os.geteuid(), os.getegid()] if os.geteuid() != 0 else None
    config = {"tmp_bytes": 1 << 20, "hide": [], "program": "", "uid": None}
    config["limits"] = {"file_size_bytes": 1 << 20}

    def private(read_only: bool = False, proc: bool = False) -> None:
        enter_namespaces(RUN_FLAGS | CLONE_NEWNET, user)
        private_files(dict(config, read_only=read_only))
        reason = _attempt(lambda: mount("proc", "/proc", "proc", MS_NOSUID)) if proc else "ok"
        if reason != "ok":
            raise OSError(reason)

    found = {
        "network": _attempt(lambda: enter_namespaces(CLONE_NEWNET, user)),
        "namespaces": _attempt(private),
        "read_only": _attempt(lambda: private(read_only=True)),
        "proc": _attempt(lambda: private(proc=True)),
    }
    print(json.dumps(found))


if __name__ == "__main__":
    if sys.argv[1:] == ["run"]:
        run(json.loads(sys.stdin.buffer.read()))
    elif sys.argv[1:] == ["probe"]:
        probe()
    else:
        _fail(f"unknown arguments {sys.argv[1:]!r}")
