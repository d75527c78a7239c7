"""One short, prepared check of the CUDA paths, bf16 training and throughput on an accelerator.

    python scripts/gpu_check.py --out gpu_check.json                 # CUDA, SmolLM2-135M-sized
    python scripts/gpu_check.py --device cpu --size tiny --out x.json   # anywhere, in seconds

In order, each section's figures written to ``--out`` (one JSON file) as soon as it ends, so a
run cut short still leaves what it measured:

0. ``environment``: versions, the device, the commit, the dtypes.
1. ``peaks``: the matrix-multiply peak in the same run (bf16 and fp32 on CUDA, fp32 on the CPU).
2. ``tests``: the suite's device tests (the files that mention ``torch.cuda``, selected by
   ``-k "cuda or auto"``) in a pytest subprocess; on the CPU the CUDA-only ones skip.
3. ``equalities``: mixed-adapter generation and prefix-shared scoring against the plain path
   (``gpu_check_equal.py``, its tolerances stated there and in the JSON).
4. ``teams``: short MAGRPO runs through the public API (2 and 4 LoRA adapters on one base, 2 full
   models, all on ``--device``; ``gpu_check_runs.py``): parameters moved, metrics finite, the
   dtypes of the trained and frozen weights, completion tokens per second and the share of peak
   for generation and the update apart, peak memory, and on CUDA the host syncs per optimizer
   step.

Models have random weights (the speed does not depend on them), so nothing is downloaded. On CUDA
the base weights are bf16 and adapters fp32; full models train in fp32 (the library keeps trainable
weights in float32). On the CPU everything is fp32. Exit status 0 when every check passed, 1
otherwise (the JSON's ``failures`` says which). ``--budget-seconds`` skips the sections and teams
that would start after it (a skipped one is a failure). The smollm2 size has not run on a GPU
yet; by estimate it takes 3 to 4 minutes on one H200 (docs/gpu.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]  # the library and benchmarks/peak.py
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402  (after the paths and the offline settings)

SECTIONS = ("tests", "equalities", "teams")
"""The sections ``--skip`` can leave out (the environment and the peaks always run)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default: cuda)")
    parser.add_argument("--size", choices=["tiny", "smollm2"], default="smollm2")
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument(
        "--budget-seconds",
        type=float,
        default=270.0,
        help="start no section or team after this many seconds (default 270)",
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=SECTIONS, help="sections to skip")
    parser.add_argument("--commit", help="the commit measured (default: git rev-parse HEAD)")
    for name in ("items", "generations", "tokens", "timed-rounds"):
        parser.add_argument(f"--{name}", type=int, help=f"override the size's {name}")
    args = parser.parse_args(argv)
    for name in ("items", "generations", "tokens", "timed_rounds"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(
            f"--device {args.device}: torch {torch.__version__} sees no CUDA device here; run "
            "on a CUDA machine, or pass --device cpu"
        )
    if args.budget_seconds <= 0:
        parser.error(f"--budget-seconds must be positive, got {args.budget_seconds}")
    if args.device == "cuda":
        args.device = "cuda:0"  # one name for the device in every figure
    return args


def commit_of(given: str | None) -> str:
    if given:
        return given
    proc = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return proc.stdout.strip() or "unknown (no git checkout; pass --commit)"


def environment(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    import peft
    import transformers

    cuda = args.device.startswith("cuda")
    return {
        "commit": commit_of(args.commit),
        "device": args.device,
        "device_name": torch.cuda.get_device_name(args.device) if cuda else platform.machine(),
        "size": args.size,
        "base_dtype": str(dtype).removeprefix("torch."),
        "adapter_dtype": "float32",
        "full_model_dtype": "float32 (the library keeps trainable weights in float32)",
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }


def measure_peaks(device: str, size: str) -> dict[str, float]:
    """FLOP/s of the matrix multiply in the dtypes the teams compute in."""
    from peak import matmul_peak

    side = 512 if size == "tiny" and device == "cpu" else None
    dtypes = [torch.bfloat16, torch.float32] if device.startswith("cuda") else [torch.float32]
    return {
        str(dtype).removeprefix("torch."): matmul_peak(device, dtype, size=side) for dtype in dtypes
    }


def run_tests(device: str) -> dict[str, Any]:
    """The device tests in a pytest subprocess; counts from its JUnit report."""
    files = sorted(
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if "torch.cuda" in p.read_text("utf-8")
    )
    env = dict(os.environ)
    if not device.startswith("cuda"):
        env["CUDA_VISIBLE_DEVICES"] = ""  # --device cpu: the tests see no GPU either
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
        command += ["-k", "cuda or auto", f"--junitxml={junit}", *files]
        started = time.perf_counter()
        proc = subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
        )
        outcomes = junit_outcomes(junit) if junit.exists() else []
    result = {
        "command": " ".join(command[1:]).replace(str(junit), "..."),
        "returncode": proc.returncode,
        "seconds": time.perf_counter() - started,
        **tally(outcomes),
    }
    if proc.returncode != 0:
        result["output_tail"] = (proc.stdout + proc.stderr)[-3000:]
    if proc.returncode != 0 and not result["failures"]:
        result["failures"] = [f"pytest exited {proc.returncode} (see tests.output_tail)"]
    if device.startswith("cuda") and result["skipped_for_no_cuda"]:
        result["failures"].append(
            f"{result['skipped_for_no_cuda']} CUDA-only test(s) skipped on {device}: the "
            "subprocess saw no GPU (CUDA_VISIBLE_DEVICES?)"
        )
    return result


Outcome = tuple[str, str, str]
"""A test's outcome (passed, failed or skipped), its failure or skip message, and its name."""


def junit_outcomes(path: Path) -> list[Outcome]:
    """Each test case of a pytest ``--junitxml`` report (an error counts as failed)."""
    outcomes = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        outcome: Outcome = ("passed", "", name)
        for tag, kind in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            found = case.find(tag)
            if found is not None:
                outcome = (kind, found.get("message") or "", name)
                break
        outcomes.append(outcome)
    return outcomes


def tally(outcomes: list[Outcome]) -> dict[str, Any]:
    """Counts, the tests skipped for want of CUDA (their reason names it), and failures."""
    counts = {k: sum(o[0] == k for o in outcomes) for k in ("passed", "failed", "skipped")}
    no_cuda = sum(o[0] == "skipped" and "cuda" in o[1].lower() for o in outcomes)
    failures = [f"test failed: {o[2]}: {o[1][:200]}" for o in outcomes if o[0] == "failed"]
    if not outcomes:
        failures.append(
            "no device test was selected (-k 'cuda or auto' in files naming torch.cuda)"
        )
    return {
        "selected": len(outcomes),
        **counts,
        "skipped_for_no_cuda": no_cuda,
        "not_passed": [f"{o[0]}: {o[2]}" for o in outcomes if o[0] != "passed"],
        "failures": failures,
    }


class Report:
    """The JSON file, rewritten after every section (a run cut short keeps what it measured)."""

    def __init__(self, path: Path, budget: float) -> None:
        self.path, self.budget, self.started = path, budget, time.perf_counter()
        self.data: dict[str, Any] = {"failures": [], "skipped_sections": []}

    def spent(self, name: str) -> bool:
        """True (and ``name`` recorded as skipped) once the budget is spent."""
        elapsed = time.perf_counter() - self.started
        if elapsed <= self.budget:
            return False
        self.data["skipped_sections"].append(f"{name} (budget spent: {elapsed:.0f} s)")
        self.data["failures"].append(f"{name} not run: --budget-seconds spent")
        self.write()
        return True

    def section(self, name: str, fn: Callable[[], Any]) -> Any:
        if self.spent(name):
            return None
        began = time.perf_counter()
        try:
            value = fn()
        except Exception:  # one broken section must not lose the others' figures
            value = {"error": traceback.format_exc()[-4000:]}
            self.data["failures"].append(f"{name} raised (see {name}.error)")
        if isinstance(value, dict):
            self.data["failures"] += value.get("failures", [])
        self.data[name] = value
        self.data.setdefault("section_seconds", {})[name] = time.perf_counter() - began
        self.write()
        return value

    def write(self, finished: bool = False) -> None:
        """``ok`` only in the last write: a file left by a run cut short says false."""
        self.data["wall_seconds"] = time.perf_counter() - self.started
        self.data["finished"] = finished
        self.data["ok"] = finished and not self.data["failures"]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        staging = self.path.with_name(self.path.name + ".tmp")
        staging.write_text(json.dumps(self.data, indent=2, default=str) + "\n", "utf-8")
        staging.replace(self.path)


def size_of(args: argparse.Namespace) -> Any:
    """The ``--size`` with the counts given on the command line."""
    from gpu_check_models import SIZES

    given = {k: getattr(args, k) for k in ("items", "generations", "tokens", "timed_rounds")}
    return dataclasses.replace(SIZES[args.size], **{k: v for k, v in given.items() if v})


def train_teams(
    size: Any, device: str, dtype: torch.dtype, peaks: dict, tokenizer: Any, report: Report
) -> dict:
    from gpu_check_runs import TEAMS, train_team

    out: dict[str, Any] = {"settings": dataclasses.asdict(size), "failures": []}
    report.data["teams"] = out  # written after each team
    for team in TEAMS:
        if report.spent(f"teams.{team.name}"):
            continue
        try:
            result = train_team(team, size, tokenizer, device, dtype, peaks)
        except Exception:  # the other teams still run
            result = {"error": traceback.format_exc()[-4000:]}
            result["failures"] = [f"teams.{team.name} raised (see teams.{team.name}.error)"]
        out["failures"] += result.pop("failures")
        out[team.name] = result
        report.write()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from gpu_check_equal import run_equalities
    from gpu_check_models import tokenizer_for

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    report = Report(args.out, args.budget_seconds)
    report.section("environment", lambda: environment(args, dtype))
    peaks = report.section("peaks", lambda: measure_peaks(args.device, args.size))
    size = size_of(args)
    tokenizer = tokenizer_for(size.model.get("vocab_size"))
    if "tests" not in args.skip:
        report.section("tests", lambda: run_tests(args.device))
    if "equalities" not in args.skip:
        report.section("equalities", lambda: run_equalities(size, tokenizer, args.device, dtype))
    if "teams" not in args.skip and isinstance(peaks, dict) and "error" not in peaks:
        report.section(
            "teams", lambda: train_teams(size, args.device, dtype, peaks, tokenizer, report)
        )
    report.write(finished=True)
    summary(report.data)
    return 0 if report.data["ok"] else 1


def summary(data: dict[str, Any]) -> None:
    """A few lines for a terminal; the JSON has everything."""
    env = data.get("environment", {})
    print(
        f"{env.get('device_name')} ({env.get('device')}), size {env.get('size')}, "
        f"commit {env.get('commit')}"
    )
    print(
        "peaks (TFLOP/s): "
        + ", ".join(
            f"{k} {v / 1e12:.2f}"
            for k, v in (data.get("peaks") or {}).items()
            if isinstance(v, float)
        )
    )
    tests = data.get("tests") or {}
    if "selected" in tests:
        print(
            f"tests: {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} "
            f"skipped ({tests['skipped_for_no_cuda']} for want of CUDA)"
        )
    for name, team in (data.get("teams") or {}).items():
        if isinstance(team, dict) and "generation" in team:
            gen, upd = team["generation"], team["update"]
            syncs = team["host_syncs"]
            per_step = syncs if isinstance(syncs, str) else f"{syncs['per_optimizer_step']:.1f}"
            print(
                f"{name}: generation {gen['completion_tokens_per_s']:.0f} tok/s "
                f"({gen['share_of_peak']:.2%} of peak), update "
                f"{upd['completion_tokens_per_s']:.0f} tok/s ({upd['share_of_peak']:.2%}), "
                f"peak memory {team['memory']['peak_bytes'] / 2**30:.2f} GiB, host syncs "
                f"per optimizer step {per_step}"
            )
    print("ok" if data.get("ok") else f"FAILED: {data.get('failures')}")
    if data.get("skipped_sections"):
        print(f"skipped: {data['skipped_sections']}")


if __name__ == "__main__":
    sys.exit(main())
