"""The sandbox against each attack of issue 13: every program ends as a result, the host is kept.

All attack programs run in ONE parallel batch (module fixture) with small limits, so the file
stays fast; each test reads its own program's result.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cmlrl_env.sandbox import (
    RunResult,
    SandboxLimits,
    isolation,
    network_isolation,
    run_program,
    run_programs,
)

ROOT = os.geteuid() == 0
PRIVATE = isolation().namespaces == "ok"
LIMITS = SandboxLimits(
    wall_time_s=2.0, cpu_time_s=1, memory_mb=256, file_size_mb=0.25, max_processes=4
)
# The spinning program gets a wall clock far above its CPU second: on a busy machine one CPU
# second can take several seconds of wall time, and the CPU limit is what this test is about.
SPIN_LIMITS = SandboxLimits(wall_time_s=30.0, cpu_time_s=1, memory_mb=256)
SECRET = "CMLRL_TEST_SECRET_TOKEN"

PROGRAMS = {
    "hello": "import sys\nprint('hello', sys.flags.isolated, sys.flags.no_site)",
    "megabytes": "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 100_000)",
    "big_file": "open('big.bin', 'wb').write(b'0' * 10_000_000)",
    "cwd_file": "import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd())",
    "outside_file": (
        "for path in {outside!r}:\n    try:\n        open(path, 'w').write('pwned')\n"
        "        print('wrote', path)\n    except OSError as e:\n        print(type(e).__name__)"
    ),
    "fork": (  # children that sleep under a name the test can find on the host
        "import os\ncount = 0\nfor _ in range(20):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n"
        "        os.execv('/bin/sleep', ['sleep', '{marker}'])\n    count += 1\nprint(count)"
    ),
    "subprocess": (
        "import subprocess\ntry:\n    subprocess.run(['sleep', '60'])\nexcept OSError as e:\n"
        "    print('refused', type(e).__name__)"
    ),
    "sleep": "import time\ntime.sleep(60)",
    "allocate": "chunks = []\nwhile True:\n    chunks.append(bytearray(10_000_000))",
    "socket": (
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        "    print('connected')\nexcept OSError as e:\n    print('no network', e.errno)"
    ),
    "environment": "import os\nprint(sorted(os.environ))",
    "import_project": "import cmlrl_env",
    "crash": "import os\nos.abort()",
}
if ROOT:  # without root the program runs as the trainer's user and could kill it (documented)
    PROGRAMS["kill_parent"] = (
        "import os, signal\ntry:\n    os.kill(os.getppid(), signal.SIGKILL)\n    print('sent')\n"
        "except OSError as e:\n    print('denied', e.errno)"
    )


def processes_named(marker: str) -> list[int]:
    """Host processes whose command line holds ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    home_folder = Path(tempfile.mkdtemp(prefix="cmlrl-sandbox-test-", dir=Path.home()))
    home_folder.chmod(0o777)  # only the sandbox, not the folder's mode, keeps the run out
    outside = [home_folder / "pwned.txt", tmp_path_factory.mktemp("trainer-owned") / "pwned.txt"]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    os.environ[SECRET] = "hunter2"
    marker = f"60.{secrets.randbelow(10**9):09d}"
    try:
        port = server.getsockname()[1]
        fields = {"outside": [str(p) for p in outside], "port": port, "marker": marker}
        sources = [p.format(**fields) for p in PROGRAMS.values()]
        done = dict(zip(PROGRAMS, run_programs(sources, LIMITS, max_workers=4), strict=True))
        (done["spin"],) = run_programs(["while True:\n    pass"], SPIN_LIMITS)
        try:
            server.accept()
            done["_accepted"] = True  # type: ignore[assignment]
        except BlockingIOError:
            pass
        done["_left"] = processes_named(marker)  # type: ignore[assignment]
        done["_outside"] = [p.exists() for p in outside]  # type: ignore[assignment]
    finally:
        del os.environ[SECRET]
        server.close()
        shutil.rmtree(home_folder, ignore_errors=True)
    return done


def test_a_plain_program_runs_isolated_without_site_packages(results) -> None:
    r = results["hello"]
    assert (r.status, r.returncode, r.stdout) == ("ok", 0, "hello 1 1\n")


def test_printing_megabytes_is_cut_by_the_file_size_limit(results) -> None:
    r = results["megabytes"]
    assert r.status == "error" and "File too large" in r.stderr
    assert len(r.stdout) == LIMITS.max_output_chars  # only the start is kept


def test_writing_a_big_file_fails_at_the_size_limit(results) -> None:
    r = results["big_file"]
    assert r.status == "error" and "File too large" in r.reason


def test_files_in_the_working_folder_are_deleted_after_the_run(results) -> None:
    r = results["cwd_file"]
    assert r.status == "ok"
    workdir = Path(r.stdout.strip())
    assert workdir.name.startswith("cmlrl-sandbox-") and not workdir.exists()


@pytest.mark.skipif(
    not (ROOT or PRIVATE), reason="without root or namespaces runs keep the trainer's user id"
)
def test_files_of_the_trainer_cannot_be_written(results) -> None:
    # A world-writable folder in the trainer's home, and the trainer's own folder under /tmp:
    # refused (another user id, a covered home, a read-only mount) or not there (private /tmp).
    r = results["outside_file"]
    assert r.status == "ok" and "wrote" not in r.stdout
    assert set(r.stdout.split()) <= {"PermissionError", "FileNotFoundError", "OSError"}
    assert results["_outside"] == [False, False]


def test_forks_stop_at_the_process_cap_and_leave_nothing_running(results) -> None:
    r = results["fork"]
    assert r.status == "ok"
    assert 1 <= int(r.stdout) < LIMITS.max_processes  # the program itself is one of them
    assert results["_left"] == []  # the sleeping children were killed with the run


def test_a_subprocess_cannot_outlive_the_run(results) -> None:
    r = results["subprocess"]
    # Either the cap refuses the fork, or the child is killed with the run at the wall clock.
    assert r.status in ("ok", "timeout")
    assert r.status == "timeout" or r.stdout.startswith("refused")


def test_a_sleeping_program_ends_at_the_wall_clock(results) -> None:
    r = results["sleep"]
    assert (r.status, r.returncode) == ("timeout", -signal.SIGKILL)


def test_a_spinning_program_ends_at_the_cpu_limit(results) -> None:
    r = results["spin"]
    assert r.status == "cpu_limit" and r.returncode == -signal.SIGXCPU


def test_unbounded_allocation_ends_in_memory_error(results) -> None:
    r = results["allocate"]
    assert r.status == "error" and "MemoryError" in r.reason


@pytest.mark.skipif(network_isolation() != "ok", reason="no network namespace here")
def test_a_socket_cannot_reach_the_host(results) -> None:
    r = results["socket"]
    assert r.status == "ok" and r.stdout.startswith("no network")
    assert r.network_isolated
    assert "_accepted" not in results


def test_the_environment_holds_none_of_the_trainers_variables(results) -> None:
    r = results["environment"]
    assert r.stdout.strip() == "['HOME', 'LANG', 'PATH', 'TMPDIR']"
    assert SECRET not in r.stdout


def test_the_trainers_packages_are_not_importable(results) -> None:
    r = results["import_project"]
    assert r.status == "error" and "ModuleNotFoundError" in r.reason


def test_a_crash_is_a_result_not_an_exception(results) -> None:
    r = results["crash"]
    assert (r.status, r.returncode) == ("killed", -signal.SIGABRT)


@pytest.mark.skipif(not ROOT, reason="only a separate user id protects the trainer's process")
def test_the_trainer_cannot_be_signalled(results) -> None:
    r = results["kill_parent"]
    assert r.stdout.strip() == "denied 1"  # EPERM, and this test process is still alive


def test_limits_are_checked_at_construction() -> None:
    with pytest.raises(ValueError, match="wall_time_s must be a positive number, got 0"):
        SandboxLimits(wall_time_s=0)
    with pytest.raises(ValueError, match="network must be one of"):
        SandboxLimits(network="none")
    with pytest.raises(ValueError, match="max_open_files=8 is below the 16"):
        SandboxLimits(max_open_files=8)
    with pytest.raises(ValueError, match="max_workers must be an int >= 1"):
        run_programs(["pass"], max_workers=0)
    with pytest.raises(TypeError, match="source must be a str"):
        run_programs([b"print(1)"])  # type: ignore[list-item]


@pytest.mark.skipif(not ROOT, reason="runs get user ids of their own only as root")
def test_two_processes_running_programs_at_once_keep_them_apart() -> None:
    # Each process hands out user ids, and a run's end may kill every process of its id: two
    # processes (two trainers, torchrun ranks) must never give one id to two running programs.
    marker = f"30.{secrets.randbelow(10**9):09d}"  # a child the test can see on the host
    long_program = (
        "import os, time\nif os.fork() == 0:\n"
        f"    os.execv('/bin/sleep', ['sleep', {marker!r}])\ntime.sleep(4)\nprint('finished')\n"
    )
    code = (
        "import sys\nfrom cmlrl_env.sandbox import run_program\n"
        f"r = run_program({long_program!r})\nprint(r.status, r.stdout.strip())\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not processes_named(marker):
            assert other.poll() is None and time.monotonic() < deadline, "the program never ran"
            time.sleep(0.05)
        assert run_program("print('short')").stdout.strip() == "short"  # ends while the other runs
        out, _ = other.communicate(timeout=120)
    finally:
        other.kill()
    assert out.split() == ["ok", "finished"]
    assert processes_named(marker) == []


@pytest.mark.skipif(not PRIVATE, reason="paths are hidden in a mount namespace")
def test_hidden_paths_cannot_be_read() -> None:
    # A file and a folder of the run's own standard library: readable by the run wherever it
    # lies, and not needed to start. Not the checkout's files: a checkout under /tmp or a home
    # is not visible to the run at all.
    found = run_program("import sysconfig\nprint(sysconfig.get_paths()['stdlib'])")
    stdlib = Path(found.stdout.strip())
    readme, docs = stdlib / "this.py", stdlib / "json"
    program = (
        f"print(len(open({str(readme)!r}).read()) > 0)\nimport os\ntry:\n"
        f"    print(os.listdir({str(docs)!r}))\nexcept OSError as e:\n    print(type(e).__name__)"
    )
    shown = run_program(program)
    hidden = run_program(program, SandboxLimits(hidden_paths=(str(readme), str(docs))))
    assert shown.stdout.startswith("True\n[")
    assert hidden.stdout == "False\nPermissionError\n"
