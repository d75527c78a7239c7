"""scripts/gpu_check.py, the check prepared for a CUDA machine, runs end to end on the CPU at the
tiny size: its JSON holds every section's figures, the teams' parameters moved, and the
equalities hold at the CPU tests' tolerances. (The suite's device tests, its ``tests`` section,
run their own pytest; here only the reading of their report is tested.)"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--size", "tiny"]
    command += ["--skip", "tests", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "ok"
    return json.loads(out.read_text("utf-8"))


def test_the_report_names_its_settings_and_passes(report) -> None:
    assert report["ok"] is True and report["finished"] is True
    assert report["failures"] == [] and report["skipped_sections"] == []
    env = report["environment"]
    assert (env["device"], env["size"], env["base_dtype"]) == ("cpu", "tiny", "float32")
    assert set(report["peaks"]) == {"float32"} and report["peaks"]["float32"] > 0
    assert "tests" not in report  # --skip tests
    assert set(report["section_seconds"]) == {"environment", "peaks", "equalities", "teams"}


def test_the_equalities_hold_at_the_cpu_tests_tolerances(report) -> None:
    eq = report["equalities"]
    assert eq["tolerances"]["adapters"]["name"] == "float32/cpu"
    gen = eq["mixed_adapter_generation"]
    # 10 rows, one prompt under both adapters: fp32 greedy paths equal token for token.
    assert gen["adapters_differ"] is True
    for other in ("vs_plain_generate", "vs_each_adapter_alone"):
        assert gen[other] == {"rows_equal": 10, "max_tie_gap": 0.0, "ok": True}
    comparisons = [
        eq["mixed_adapter_scoring"]["prefix_shared_vs_plain"],
        eq["mixed_adapter_scoring"]["mixed_vs_each_adapter_alone"],
        eq["full_model_scoring"]["prefix_shared_vs_plain"],
    ]
    for scoring in comparisons:
        assert scoring["ok"] and scoring["grads_nonzero"]
        assert scoring["grads_elementwise_allclose_as_tests"]
        assert scoring["max_logprob_diff"] <= 1e-5 and scoring["max_grad_rel_l2"] <= 1e-4
    assert "mixed_vs_each_adapter_alone" not in eq["full_model_scoring"]


def test_every_team_trained_and_was_measured(report) -> None:
    teams = report["teams"]
    assert teams["settings"]["items"] == 2 and teams["failures"] == []
    for name, agents in (("adapters_2", 2), ("adapters_4", 4), ("full_2", 2)):
        team = teams[name]
        assert team["agents"] == agents and team["metrics_finite"]
        assert team["rounds"] == 2  # the counted round and one timed round; no sync count
        assert team["host_syncs"] == "n/a"
        # float32 everywhere on the CPU; the shared base of adapter agents is its own dtype
        frozen = ["float32"] if team["adapters"] else []
        assert team["weight_dtypes"] == {"trained": ["float32"], "frozen": frozen}
        # Every trainable tensor of every agent moved (LoRA's B from its zeros, A after it).
        assert len(team["parameters_moved"]) == agents
        assert all(a["share_changed"] == 1.0 for a in team["parameters_moved"])
        # agents x 2 items x G=2 x 4 forced tokens
        assert team["completion_tokens_per_round"] == agents * 2 * 2 * 4
        # adapters share one generate call per round; full models make one each
        assert team["generate_calls_per_round"] == (1 if team["adapters"] else agents)
        assert team["generation"]["flops"] + team["update"]["flops"] == team["round"]["flops"]
        for phase in ("generation", "update", "round"):
            assert team[phase]["flops"] > 0 and 0 < team[phase]["share_of_peak"] < 1
        assert team["generation"]["completion_tokens_per_s"] > 0
        assert "RSS" in team["memory"]["kind"] and team["memory"]["peak_bytes"] > 0


@pytest.fixture
def gpu_check():
    saved = list(sys.path)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        yield importlib.import_module("gpu_check")
    finally:
        sys.path[:] = saved  # the script puts the repository and benchmarks/ first


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.agents.test_a" name="test_passes" />
<testcase classname="tests.agents.test_a" name="test_on_cuda">
  <skipped type="pytest.skip" message="needs a CUDA device" /></testcase>
<testcase classname="tests.agents.test_b" name="test_kill">
  <skipped type="pytest.skip" message="needs SIGKILL" /></testcase>
<testcase classname="tests.agents.test_b" name="test_breaks">
  <failure message="assert 1 == 2">trace</failure></testcase>
</testsuite></testsuites>
"""


def test_the_device_tests_are_counted_from_their_junit_report(gpu_check, tmp_path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT, "utf-8")
    counts = gpu_check.tally(gpu_check.junit_outcomes(path))
    assert (counts["selected"], counts["passed"], counts["failed"], counts["skipped"]) == (
        4,
        1,
        1,
        2,
    )
    assert counts["skipped_for_no_cuda"] == 1  # SIGKILL's skip is not for want of CUDA
    assert counts["failures"] == ["test failed: tests.agents.test_b::test_breaks: assert 1 == 2"]
    assert gpu_check.tally([])["failures"][0].startswith("no device test was selected")
