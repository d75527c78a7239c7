"""A sandboxed run leaves nothing behind: no IPC objects, files, processes, or a user id that its
next holder cannot use; its shared folders have one size limit; its memory is bounded per run.

The programs run in one parallel batch per mode: with the namespaces this machine gives, and
(as root) with them turned off, where the clean-up goes by the run's user id.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest
from test_sandbox import processes_named

from cmlrl_env import sandbox
from cmlrl_env.sandbox import Isolation, SandboxLimits, isolation, run_program, run_programs

ROOT = os.geteuid() == 0
PRIVATE = isolation().namespaces == "ok"
LIMITS = SandboxLimits(
    wall_time_s=3.0, cpu_time_s=2, memory_mb=256, file_size_mb=0.25, tmp_size_mb=1.0
)
SHARED = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
IPC = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
ids = [libc.shmget({key}, 4096, 0o1666), libc.msgget({key}, 0o1666), libc.semget({key}, 1, 0o1666)]
print(*ids)
"""
FILES = """
for folder in {shared!r}:
    try:
        open(folder + "/{marker}", "w").write("left")
        print("wrote", folder)
    except OSError as e:
        print("refused", folder, type(e).__name__)
"""
DAEMON = """
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    os._exit(0)
print("started")
"""
FILL = """
written = 0
for folder in ("/tmp", "/dev/shm", "/var/tmp"):
    for i in range(100):
        try:
            with open(f"{folder}/fill{i}", "wb") as f:
                f.write(b"0" * 200_000)
            written += 200_000
        except OSError as e:
            print(written, e.errno)
            raise SystemExit
print(written, 0)
"""


def ipc_keys() -> set[int]:
    keys = set()
    for kind in ("shm", "msg", "sem"):
        with open(f"/proc/sysvipc/{kind}") as f:
            keys |= {int(line.split()[0]) for line in list(f)[1:]}
    return keys


def run_and_look(private: bool) -> dict:
    """Run the programs; what each printed, and what of theirs is left on the host."""
    key = secrets.randbelow(2**30) + 1
    name = f"cmlrl-test-{secrets.token_hex(4)}"
    sleep_marker = f"90.{secrets.randbelow(10**9):09d}"
    sources = {
        "ipc": IPC.format(key=key),
        "files": FILES.format(shared=SHARED, marker=name),
        "daemon": DAEMON.format(marker=sleep_marker),
    }
    found = isolation() if private else Isolation("ok", "turned off by the test", "", "", "")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sandbox, "isolation", lambda: found)
        results = run_programs(list(sources.values()), LIMITS, max_workers=4)
    look = {n: r for n, r in zip(sources, results, strict=True)}
    look["_ipc_left"] = key in ipc_keys()
    look["_files_left"] = [f for f in SHARED if Path(f, name).exists()]
    look["_processes_left"] = processes_named(sleep_marker)
    return look


@pytest.fixture(scope="module", params=["namespaces", "user id"])
def left(request: pytest.FixtureRequest) -> dict:
    if request.param == "namespaces" and not PRIVATE:
        pytest.skip(f"no namespaces here: {isolation().namespaces}")
    if request.param == "user id" and not ROOT:
        pytest.skip("without namespaces only root can find what a run left (its own user id)")
    return run_and_look(request.param == "namespaces")


def test_ipc_objects_die_with_the_run(left) -> None:
    assert left["ipc"].status == "ok" and min(map(int, left["ipc"].stdout.split())) >= 0
    assert not left["_ipc_left"]


def test_files_in_the_shared_folders_die_with_the_run(left) -> None:
    assert left["files"].status == "ok" and "wrote /tmp" in left["files"].stdout
    assert left["_files_left"] == []


def test_a_daemon_that_left_the_process_group_dies_with_the_run(left) -> None:
    assert left["daemon"].stdout == "started\n"
    assert left["_processes_left"] == []


@pytest.mark.skipif(not PRIVATE, reason="the shared folders are the host's without namespaces")
def test_the_shared_folders_have_one_size_limit_together() -> None:
    (r,) = run_programs([FILL], LIMITS)
    written, errno = map(int, r.stdout.split())
    assert errno == 28  # ENOSPC: /tmp, /dev/shm and /var/tmp share one tmpfs of 1 MB
    assert 0 < written <= LIMITS.tmp_size_mb * 2**20


def test_a_run_at_one_process_holds_at_most_its_memory_limit() -> None:
    # The code reward's runs: one process (no fork, no thread), so the per-process address space
    # limit is the run's limit on every machine, cgroups or not.
    program = (
        "import os\ntry:\n    os.fork()\n    print('forked')\nexcept OSError as e:\n"
        "    print('no fork', e.errno)\ntry:\n    x = bytearray(300 << 20)\n    print('held')\n"
        "except MemoryError:\n    print('no memory')"
    )
    limits = SandboxLimits(wall_time_s=3.0, memory_mb=256, max_processes=1)
    assert run_program(program, limits).stdout == "no fork 11\nno memory\n"


@pytest.mark.skipif(isolation().memory != "ok", reason=f"no run cgroup: {isolation().memory}")
def test_forked_children_share_one_memory_limit() -> None:
    # Three children each fill 200 MB (written, so resident) and stay; the run's bound (cgroup
    # v2 memory.max or v1 memory.limit_in_bytes) ends all but one of them, whichever it picks.
    program = (
        "import os, time\npids = []\nfor _ in range(3):\n    r, w = os.pipe()\n"
        "    pid = os.fork()\n    if pid == 0:\n        x = b'x' * (200 << 20)\n"
        "        os.write(w, b'1')\n        time.sleep(60)\n    os.close(w)\n    os.read(r, 1)\n"
        "    pids.append(pid)\ntime.sleep(0.5)\n"
        "print(sum(os.waitpid(p, os.WNOHANG) == (0, 0) for p in pids))"
    )
    r = run_program(program, SandboxLimits(wall_time_s=10.0, memory_mb=256, max_processes=4))
    assert r.status == "ok" and int(r.stdout) <= 1  # 2 x 200 MB never fit in the run's 256 MB


@pytest.mark.skipif(not (PRIVATE or ROOT), reason="without root or namespaces runs share an id")
def test_the_next_run_can_fork_right_after_a_fork_bomb() -> None:
    bomb = (
        "import os, time\nwhile True:\n    try:\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n    except OSError:\n        break"
    )
    fork_once = (
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
        "print('forked')"
    )
    limits = SandboxLimits(wall_time_s=2.0, max_processes=8)
    assert run_program(bomb, limits).status == "ok"
    assert run_program(fork_once, limits).stdout == "forked\n"
