"""The sandbox without root: the launcher started as user 65534, as a trainer without root runs it.

CI runs as root, where runs get user ids of their own; these tests send the launcher the
configuration a trainer without root sends (a user namespace with the others) and start it as
user 65534, so that path is tested too. They skip where the tests do not run as root, or user
65534 cannot run the launcher (no ``setpriv``, no /usr/bin/python3, a checkout under a private
home) or make a user namespace.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from cheats import HONEST, TRICKS
from test_sandbox import processes_named
from test_sandbox_cleanup import DAEMON, FILES, IPC, SHARED, ipc_keys

from cmlrl_env import _sandbox_host as host
from cmlrl_env import sandbox
from cmlrl_env.code_reward import DEFAULT_LIMITS, _checker, _dynamic, _program, _static
from cmlrl_env.code_tasks import problem_of

NOBODY = 65534
PYTHON = "/usr/bin/python3"
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", PYTHON]
LIMITS = sandbox.SandboxLimits(wall_time_s=5.0, memory_mb=256, max_processes=4)


@functools.lru_cache(maxsize=1)
def why_not() -> str:
    """'' when user 65534 gets every namespace from the launcher, else why it cannot."""
    if os.geteuid() != 0:
        return "these tests become user 65534, which needs root"
    if shutil.which("setpriv") is None or not os.path.exists(PYTHON):
        return f"setpriv or {PYTHON} is missing"
    done = subprocess.run(
        [*AS_NOBODY, "-I", "-S", "-B", host.CHILD, "probe"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return f"user 65534 cannot run the launcher: {done.stderr.strip()[-200:]}"
    found = json.loads(done.stdout)
    return "" if found == dict.fromkeys(found, "ok") else f"not all namespaces: {found}"


pytestmark = pytest.mark.skipif(bool(why_not()), reason=why_not() or "runs")


def run_as_nobody(source: str, limits=LIMITS, checker=None) -> dict:
    """The launcher's report of one run, started by user 65534 with a non-root plan."""
    config = {
        **sandbox._config(source, limits, checker, PYTHON),
        "flags": sandbox._CLONE_NEWNET | sandbox._RUN_FLAGS,
        "user_ids": [NOBODY, NOBODY],
        "private": True,
        "read_only": True,
        "proc": True,
        "uid": None,
        "workdirs": [],
        "cgroups": [],
    }
    done = subprocess.run(
        [*AS_NOBODY, "-I", "-S", "-B", host.CHILD, "run"],
        input=json.dumps(config),
        capture_output=True,
        text=True,
        cwd="/",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_run_is_user_1000_and_sees_only_its_own_processes() -> None:
    out = run_as_nobody(
        "import os\nprint(os.getuid(), sorted(filter(str.isdigit, os.listdir('/proc'))))"
    )
    assert out["stdout"] == "1000 ['1', '2']\n"


def test_the_trainers_own_files_are_read_only() -> None:
    if not os.access("/run", os.W_OK):
        pytest.skip("no writable /run for a folder of user 65534 outside /tmp")
    folder = Path(tempfile.mkdtemp(prefix="cmlrl-test-", dir="/run"))
    try:
        os.chown(folder, NOBODY, NOBODY)  # the "trainer's" folder: its own user may write there
        out = run_as_nobody(f"open({str(folder / 'pwned')!r}, 'w')")
        assert "Read-only file system" in out["stderr"] and not (folder / "pwned").exists()
    finally:
        shutil.rmtree(folder)


def test_the_launcher_cannot_be_signalled_or_read() -> None:
    program = (
        "import os, signal\nos.kill(1, signal.SIGKILL)\nprint('alive')\ntry:\n"
        "    open('/proc/1/mem', 'rb').read(1)\nexcept OSError as e:\n    print(type(e).__name__)"
    )
    assert run_as_nobody(program)["stdout"] == "alive\nPermissionError\n"


def test_ipc_objects_files_and_daemons_die_with_the_run() -> None:
    key, name = secrets.randbelow(2**30) + 1, f"cmlrl-test-{secrets.token_hex(4)}"
    marker = f"90.{secrets.randbelow(10**9):09d}"
    outs = [
        run_as_nobody(IPC.format(key=key)),
        run_as_nobody(FILES.format(shared=SHARED, marker=name)),
        run_as_nobody(DAEMON.format(marker=marker)),
    ]
    assert min(map(int, outs[0]["stdout"].split())) >= 0 and "wrote /tmp" in outs[1]["stdout"]
    assert key not in ipc_keys()
    assert [f for f in SHARED if Path(f, name).exists()] == []
    assert processes_named(marker) == []


@functools.cache
def score_as_nobody(task: str, helper: str, main: str) -> float:
    problem = problem_of({"task_id": task})
    static = _static(problem, helper, main)
    out = run_as_nobody(_program(problem, static.program), DEFAULT_LIMITS, _checker(problem, 3.0))
    result = sandbox.RunResult("ok", out["returncode"], "", out["stderr"], 0.0, True, out["report"])
    return _dynamic(problem, static, result).reward


@pytest.mark.parametrize("name", [n for n, t in TRICKS.items() if t[3] == "wrong"])
def test_a_trick_scores_no_more_than_a_wrong_answer(name: str) -> None:
    task, helper, main, _ = TRICKS[name]
    assert score_as_nobody(task, helper, main) <= score_as_nobody(task, *HONEST["wrong"][task])
