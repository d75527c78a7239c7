"""The benchmark scripts parse their settings and run end to end on a tiny model (no timings
are asserted: benchmarks are outside the test suite's claims)."""

from __future__ import annotations

import importlib
import itertools
import os
import platform
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from cmlrl_agents.policies.decode_layout import onednn_linear
from cmlrl_agents.testing import tiny_model, tiny_tokenizer

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import their shared helper module
    try:
        names = ("floor", "learning", "vs_comlrl", "peak", "decode_layout", "adapter_spans")
        yield {name: importlib.import_module(name) for name in names}
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_learning_defaults_are_the_issue_settings(bench) -> None:
    args = bench["learning"].parse_args([])
    assert (args.items, args.epochs, args.eval_repeats, args.eval_every) == (8, 2, 8, 4)
    assert args.lr is None and args.comlrl_lr is None and args.only is None
    assert args.budget_seconds is None and not args.match_comlrl_time and args.set == []
    assert args.keep_run is None  # our run folder is a temporary one unless asked to keep it
    short = bench["learning"].parse_args(["--items", "2", "--epochs", "1", "--only", "cmlrl"])
    assert (short.items, short.epochs, short.only) == (2, 1, "cmlrl")
    kept = bench["learning"].parse_args(["--keep-run", "runs/a"])
    assert kept.keep_run == Path("runs/a")


def test_learning_set_reads_json_values(bench) -> None:
    args = bench["learning"].parse_args(["--set", "temperature=0.8", "--set", "top_k=null"])
    assert args.set == [("temperature", 0.8), ("top_k", None)]


def test_learning_refuses_a_comlrl_budget_without_comlrl(bench, capsys) -> None:
    with pytest.raises(SystemExit):
        bench["learning"].parse_args(["--only", "cmlrl", "--match-comlrl-time"])
    assert "--match-comlrl-time runs comlrl first" in capsys.readouterr().err


def test_learning_refuses_to_keep_a_run_it_does_not_make(bench, capsys) -> None:
    with pytest.raises(SystemExit):
        bench["learning"].parse_args(["--only", "comlrl", "--keep-run", "runs/a"])
    assert "--keep-run keeps our run folder, and --only comlrl runs none" in capsys.readouterr().err


def test_learning_seeds_torch_for_comlrl_only(bench, monkeypatch) -> None:
    # comlrl has no seed of its own: --seed reaches it through torch's global generator; ours
    # draws from its config's seed and keeps the generator at 0, as in every earlier run.
    specs = {}

    def child(python, program, spec, threads):
        specs["comlrl" if "from comlrl" in program else "cmlrl"] = spec
        return {"before": 0.0, "after": 0.0, "seconds": 1.0, "cpu_seconds": 1.0}

    monkeypatch.setattr(bench["learning"], "run_child", child)
    monkeypatch.setattr(bench["learning"], "reference_python", lambda venv: "python")
    args = bench["learning"].parse_args(["--seed", "3"])
    for name in ("comlrl", "cmlrl"):
        bench["learning"].run(name, args, None)
    assert (specs["comlrl"]["torch_seed"], specs["comlrl"]["seed"]) == (3, 3)
    assert (specs["cmlrl"]["torch_seed"], specs["cmlrl"]["seed"]) == (0, 3)


CURVE = [
    {"rounds": 0, "items": 0, "train_s": 0.0, "train_cpu_s": 0.0, "reward": 0.40, "se": 0.1},
    {"rounds": 1, "items": 4, "train_s": 90.0, "train_cpu_s": 80.0, "reward": 0.70, "se": 0.1},
    {"rounds": 2, "items": 8, "train_s": 190.0, "train_cpu_s": 160.0, "reward": 0.80, "se": 0.1},
]


def test_learning_targets_read_the_curve(bench) -> None:
    learning = bench["learning"]
    # The first evaluation at or above the reward; None when no evaluation reaches it.
    assert learning.time_to_reach(CURVE, 0.7)["rounds"] == 1
    assert learning.time_to_reach(CURVE, 0.81) is None
    # The last evaluation trained no longer than the given time, on the named clock.
    assert learning.reward_at(CURVE, 170.0, "train_cpu_s")["reward"] == 0.80
    assert learning.reward_at(CURVE, 170.0, "train_s")["reward"] == 0.70


def test_learning_curve_on_a_tiny_model(bench, tmp_path: Path, capsys) -> None:
    tokenizer = tiny_tokenizer()
    tiny_model(len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    common = ["--model", str(tmp_path), "--only", "cmlrl", "--items", "4", "--epochs", "2"]
    common += ["--threads", "1", "--eval-repeats", "2", "--lr", "0.05"]
    common += ["--set", "rollout_buffer_size=2"]
    every = bench["learning"].main([*common, "--eval-every", "2", "--yardstick", "0.9", "50"])
    ours = every["cmlrl"]["curve"]
    # Evaluations before each round (2 items, rollout_buffer_size 2) and one after training.
    assert [p["items"] for p in ours] == [0, 2, 4, 6, 8]
    assert [p["rounds"] for p in ours] == [0, 1, 2, 3, 4]
    times = [p["train_cpu_s"] for p in ours]
    assert times == sorted(times)
    assert ours[-1]["reward"] != ours[0]["reward"]  # it trained: the weights changed
    assert "time to reach comlrl's final reward 0.900" in capsys.readouterr().out
    # Evaluation samples from its own seed: evaluating less often leaves training, and so the
    # final evaluation, unchanged.
    sparse = bench["learning"].main([*common, "--eval-every", "4"])
    assert [p["items"] for p in sparse["cmlrl"]["curve"]] == [0, 4, 8]
    assert sparse["cmlrl"]["after"] == every["cmlrl"]["after"]


@pytest.mark.parametrize("module", ["learning", "floor"])
def test_counts_below_one_are_refused(bench, module: str, capsys) -> None:
    with pytest.raises(SystemExit):
        bench[module].parse_args(["--items", "0"])
    assert "--items must be at least 1" in capsys.readouterr().err


def test_vs_comlrl_uses_the_shared_helpers(bench) -> None:
    helpers = importlib.import_module("reference_env")
    assert bench["vs_comlrl"].reference_python is helpers.reference_python
    assert bench["vs_comlrl"].run is helpers.run_child


def test_vs_comlrl_rotates_the_sides_and_reads_each_repeats_own_ratios(bench, capsys) -> None:
    vs = bench["vs_comlrl"]
    sides = ["comlrl", "cmlrl-full", "cmlrl-lora"]
    assert [vs.run_order(sides, r) for r in range(4)] == [
        sides,
        ["cmlrl-full", "cmlrl-lora", "comlrl"],
        ["cmlrl-lora", "comlrl", "cmlrl-full"],
        sides,
    ]

    def side(seconds: float, peak: float) -> dict:
        return {"seconds": seconds, "items": 4, "peak_gb": peak}

    runs = [
        {"comlrl": side(60.0, 6.0), "cmlrl-full": side(30.0, 4.5)},
        {"comlrl": side(66.0, 5.0), "cmlrl-full": side(22.0, 4.5)},
    ]
    speed, memory = vs.ratios(runs, "full")
    assert speed == [2.0, 3.0] and memory == [0.75, 0.9]
    assert vs.parse_args(["--repeats", "3"]).repeats == 3 and vs.parse_args([]).repeats == 1
    with pytest.raises(SystemExit):
        vs.parse_args(["--repeats", "0"])
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err


class _Generator:
    def generate(self, depth: int = 0) -> torch.Tensor:
        inner = self.generate(depth + 1) if depth < 2 else None  # nested: counted once
        return torch.ones(4, 8) @ torch.ones(8, 3) if inner is None else inner


class _Child(_Generator):
    pass


def test_the_round_meter_tells_generation_from_the_update(bench) -> None:
    peak = bench["peak"]
    meter = peak.RoundMeter("cpu", [(_Child, "generate")])
    parameter = torch.nn.Parameter(torch.ones(2, 5))
    optimizer = torch.optim.SGD([parameter], lr=0.1)

    def round_fn() -> None:
        _Child().generate()  # a 4x8 @ 8x3 product: 2 * 4 * 8 * 3 = 192 FLOPs
        (parameter @ torch.ones(5, 7)).sum().backward()  # 2 * 2 * 5 * 7 = 140 forward
        optimizer.step()  # and backward: d(parameter) = grad @ ones(5, 7).T, 140 more

    meter.count(round_fn)
    assert (meter.flops.generation, meter.flops.update, meter.flops.total) == (192, 280, 472)
    assert meter.flops.generate_calls == 1  # the two nested calls are inside the first
    meter.time(round_fn)
    best = meter.best()
    assert best.generate_calls == 1 and 0 < best.generation + best.update <= best.total
    # Wrapping an inherited method leaves the subclass inheriting it again afterwards.
    assert "generate" not in _Child.__dict__ and _Child.generate is _Generator.generate
    figures = meter.figures(peak=1e12)
    assert figures["update"]["flops"] == 280
    assert figures["round"]["share_of_peak"] == 472 / best.total / 1e12


@pytest.mark.skipif(not onednn_linear(), reason="this torch has no oneDNN linear")
def test_the_round_meter_counts_products_on_weights_packed_for_onednn(bench) -> None:
    meter = bench["peak"].RoundMeter("cpu", [(_Child, "generate")])
    packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(3, 8), 8)  # [out, in]

    def round_fn() -> None:
        _Child().generate()  # 192 FLOPs, as above
        torch.ops.mkldnn._linear_pointwise(torch.ones(2, 5, 8), packed, None, "none", [], "")

    meter.count(round_fn)  # the packed product: 2 * (2 * 5) * 8 * 3 = 480 FLOPs
    assert (meter.flops.generation, meter.flops.total) == (192, 672)


def test_the_round_meter_times_each_update_from_its_generation_to_its_last_step(bench) -> None:
    """A clock that reads 0, 1, 2, ...: two rounds of generate, step, step inside one timed
    call, then logging (no step) before the end."""
    ticks = itertools.count()
    meter = bench["peak"].RoundMeter("cpu", [(_Child, "generate")], clock=lambda: next(ticks))
    parameter = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([parameter], lr=0.1)
    parameter.grad = torch.ones(2)

    def two_rounds() -> None:
        for _ in range(2):
            _Child().generate()
            optimizer.step()
            optimizer.step()

    meter.time(two_rounds)
    # began 0 | generate 1..2 | steps end 3, 4 | generate 5..6 (update 4 - 2) | steps end 7, 8
    # | round ends 9 (update 8 - 6)
    (totals,) = meter.seconds
    assert (totals.generation, totals.update, totals.total) == (2, 4, 9)
    assert totals.generate_calls == 2


def test_the_round_meter_refuses_a_round_without_generation(bench) -> None:
    peak = bench["peak"]
    meter = peak.RoundMeter("cpu", [(_Child, "generate")])
    meter.count(lambda: torch.ones(2, 2) @ torch.ones(2, 2))
    meter.time(lambda: None)
    with pytest.raises(RuntimeError, match="no call of \\['_Child.generate'\\] was seen"):
        meter.figures(peak=1.0)
    with pytest.raises(AttributeError, match="_Child has no method 'sample'"):
        peak.RoundMeter("cpu", [(_Child, "sample")]).count(lambda: None)


@pytest.mark.parametrize(("bf16", "backend"), [(False, "hf"), (True, "hf"), (False, "hf_bf16")])
def test_vs_comlrl_reports_our_share_of_the_peak(
    bench, tmp_path: Path, bf16: bool, backend: str
) -> None:
    """Our child program on a tiny model: its timed run, then the share of the matmul peak of
    generation and the update, from FLOPs counted in one more epoch over the same items."""
    spec = _tiny_vs_spec(tmp_path, bf16, backend)
    result = bench["vs_comlrl"].run(sys.executable, bench["vs_comlrl"].OURS, spec, 1)
    assert result["items"] == 2 and result["seconds"] > 0
    assert result["tokens"] == 2 * 4 * 2 * 3  # items x G x agents x forced tokens
    share = result["share"]
    assert set(share) == {"generation", "update", "round"}
    assert all(0 < share[p]["share_of_peak"] < 1 for p in share)
    assert share["generation"]["flops"] + share["update"]["flops"] == share["round"]["flops"]


def test_vs_comlrl_times_a_later_repeat_without_counting_flops(bench, tmp_path: Path) -> None:
    spec = _tiny_vs_spec(tmp_path, False, "hf") | {"count": False}
    result = bench["vs_comlrl"].run(sys.executable, bench["vs_comlrl"].OURS, spec, 1)
    assert result["share"] is None and result["items"] == 2 and result["seconds"] > 0


def _tiny_vs_spec(tmp_path: Path, bf16: bool, backend: str) -> dict:
    """vs_comlrl's child spec for our adapter agents on a tiny model saved under ``tmp_path``:
    1 turn, 2 items, 3 forced tokens."""
    tokenizer = tiny_tokenizer()
    tiny_model(len(tokenizer)).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    spec = {"turns": 1, "items": 2, "tokens": 3, "setup": "lora", "benchmarks": str(BENCHMARKS)}
    spec |= {"bf16": bf16, "generation_backend": backend}
    return spec | {"model": str(tmp_path / "model"), "out": str(tmp_path / "run")}


@pytest.mark.parametrize("setup", ["full", "lora"])
def test_floor_runs_one_round_of_each_on_a_tiny_model(
    bench, tmp_path: Path, capsys, setup: str
) -> None:
    tokenizer = tiny_tokenizer()
    tiny_model(len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    argv = ["--model", str(tmp_path), "--items", "2", "--tokens", "3", "--repeats", "1"]
    best = bench["floor"].main([*argv, "--setup", setup])
    assert set(best) == {"floor", "train", "round", "share"}
    assert all(best[name] > 0 for name in ("floor", "train", "round"))
    out = capsys.readouterr().out
    assert "x the floor" in out and out.startswith(f"{setup}: 2 agents")
    # The share of the matmul peak, per timed call, generation and the update apart: each
    # phase did matrix work in some of the time it took, and the two add up to the round's
    # FLOPs (its seconds also hold the trainer's logging, in neither phase).
    assert "share of the fp32 matmul peak" in out
    for name in ("floor", "train", "round"):
        phases = best["share"][name]
        assert set(phases) == {"generation", "update", "round"}
        for figures in phases.values():
            assert figures["flops"] > 0 and 0 < figures["seconds"]
            assert 0 < figures["share_of_peak"] < 1
        flops = phases["generation"]["flops"] + phases["update"]["flops"]
        assert flops == phases["round"]["flops"]
        seconds = phases["generation"]["seconds"] + phases["update"]["seconds"]
        assert seconds <= phases["round"]["seconds"]


@pytest.fixture
def tiny_folder(tmp_path: Path) -> Path:
    """A tiny model and its tokenizer saved as a local folder, for a script's ``--model``."""
    tokenizer = tiny_tokenizer()
    tiny_model(len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_decode_layout_compares_both_paths_on_a_tiny_model(bench, tiny_folder, capsys) -> None:
    decode_layout = bench["decode_layout"]
    argv = ["--model", str(tiny_folder), "--rows", "2", "4", "--tokens", "3", "--repeats", "1"]
    decode_layout.main(argv)
    out = capsys.readouterr().out
    assert "torch's CPU kernels: " in out and "CPU vendor: " in out
    assert "the library's decoding weights here: " in out
    sides = 3 if onednn_linear() else 1  # copies, and where oneDNN is the two packings
    assert out.count("rows: without") == 2 and out.count("same tokens: True") == 2 * sides
    assert out.count(" rows: ") == 2 + 3 * 2  # 3 weight shapes at each row count
    with pytest.raises(SystemExit):
        decode_layout.parse_args(["--rows", "3"])


def test_adapter_spans_compares_the_three_sides_on_a_tiny_model(bench, tiny_folder, capsys) -> None:
    adapter_spans = bench["adapter_spans"]
    argv = ["--model", str(tiny_folder), "--rows", "4", "--tokens", "3", "--repeats", "2"]
    adapter_spans.main(argv)
    with pytest.raises(SystemExit):
        adapter_spans.parse_args(["--rows", "6"])
    with pytest.raises(SystemExit):
        adapter_spans.parse_args(["--repeats", "0"])
    out = capsys.readouterr().out
    assert "4 rows (2 adapters), 3 forced tokens" in out
    assert re.search(r"slices +[0-9.]+ \([0-9.]+x peft's; runs [0-9.]+, [0-9.]+\)", out)
    assert "peft     " in out and "base     " in out
    assert "the slices sampled peft's tokens: True" in out


def test_decode_layout_times_the_update_shapes_without_generating(bench, capsys) -> None:
    decode_layout = bench["decode_layout"]
    argv = ["--rows", "2", "--update-rows", "4", "--repeats", "1", "--skip-generation"]
    decode_layout.main(argv)
    with pytest.raises(SystemExit):
        decode_layout.parse_args(["--update-rows", "0"])
    out = capsys.readouterr().out
    assert "rows: without" not in out  # no generate calls
    update_lines = [line for line in out.splitlines() if " x   4 rows: " in line]
    assert len(update_lines) == (3 if onednn_linear() else 0)  # the 3 weight shapes
    assert all("GFLOP/s" in line for line in update_lines)


def _profile_tiny_main_job(tmp_path: Path, options: list[str]) -> subprocess.CompletedProcess[str]:
    """profile_calls.py with ``options`` over one epoch of the --tiny main job (2 new tokens);
    its finished process, checked to have succeeded."""
    root = BENCHMARKS.parent
    command = [sys.executable, str(BENCHMARKS / "profile_calls.py"), *options]
    command += [str(root / "examples" / "length_ratio.py"), "--tiny", "--epochs", "1"]
    command += ["--eval-repeats", "1", "--max-new-tokens", "2", "--output-dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(root), "WANDB_MODE": "disabled"}
    proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def test_profile_calls_counts_the_main_job_calls(tmp_path: Path) -> None:
    # --tiny main job, 1 epoch of 8 items: 4 rounds (rollout_buffer_size 2) and 2 evaluations,
    # so 2 agents x (4 + 2) generate calls and one AdamW step per agent and round, from one
    # forward chunk (8 samples, forward_batch_size 8) with a backward each. The timeline lists
    # each of those calls once, and the second round's operators come from torch.profiler;
    # the allocator switch needs glibc.
    options = ["--timeline", "--ops-of-round", "2"]
    if platform.libc_ver()[0] == "glibc":
        options.append("--keep-freed-memory")
    proc = _profile_tiny_main_job(tmp_path, options)
    calls, faults = {}, {}
    for line in proc.stderr.splitlines():
        if " calls " in line:
            name, rest = line.split(" calls ")
            calls[name.strip()] = int(rest.split()[0])
            faults[name.strip()] = int(rest.split(" faults ")[1])
    assert calls["generate"] == 12
    # a round's page faults hold those of the update inside it, which hold its backwards'
    assert faults["MAGRPOTrainer round"] >= faults["PolicyGradientLearner.update"]
    assert faults["PolicyGradientLearner.update"] >= faults["backward"] > 0
    assert calls["TeamTrainer.evaluate_items"] == 2
    assert calls["MAGRPOTrainer round"] == calls["PolicyGradientLearner.update"] == 4
    assert calls["AdamW.step"] == 8
    assert calls["backward"] == 8
    # prefix_sharing (the default): one prompt forward and one continuation forward per scoring
    assert calls["forward/grad"] == 2 * 8
    assert "forward/no_grad" not in calls  # no reference model, no re-scoring pass
    # (a progress bar's carriage returns can share a line with the timeline)
    timeline = Counter(
        re.findall(r"(generate|backward|AdamW\.step|MAGRPOTrainer round) +at ", proc.stderr)
    )
    assert timeline == {"generate": 12, "backward": 8, "AdamW.step": 8, "MAGRPOTrainer round": 4}
    assert len(re.findall(r"took +[\d.]+ s +faults +\d+", proc.stderr)) == 12 + 8 + 8 + 4
    assert proc.stderr.count("operators by self CPU time") == 1
    assert "round 2, operators by self CPU time" in proc.stderr and "aten::mm" in proc.stderr
    assert "process: user " in proc.stderr and "minor page faults" in proc.stderr


def test_profile_calls_answers_help_and_refuses_an_unknown_option() -> None:
    script = str(BENCHMARKS / "profile_calls.py")
    shown = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: ")
    assert "--timeline" in shown.stdout and "page faults" in shown.stdout
    wrong = subprocess.run(
        [sys.executable, script, "--bogus", "train.py"], capture_output=True, text=True
    )
    assert wrong.returncode != 0 and "an unknown option?" in wrong.stderr


def test_profile_calls_sorts_a_rounds_operators_by_the_memory_they_allocate(
    tmp_path: Path,
) -> None:
    alone = subprocess.run(
        [sys.executable, str(BENCHMARKS / "profile_calls.py"), "--ops-by-memory", "train.py"],
        capture_output=True,
        text=True,
    )
    assert alone.returncode != 0 and "give both" in alone.stderr
    proc = _profile_tiny_main_job(tmp_path, ["--ops-of-round", "2", "--ops-by-memory"])
    table = proc.stderr.split("round 2, operators by self memory:")[1]
    # the rows come largest allocation first, in the table's "Self CPU Mem" column
    sizes = []
    for line in table.splitlines():
        cells = re.findall(r"(-?[\d.]+) (b|Kb|KB|MB|GB)\b", line)
        if line.strip().startswith("aten::") and len(cells) >= 2:
            number, unit = cells[1]
            scale = {"b": 1, "Kb": 2**10, "KB": 2**10, "MB": 2**20, "GB": 2**30}[unit]
            sizes.append(float(number) * scale)
    assert len(sizes) >= 3 and sizes == sorted(sizes, reverse=True)


def test_free_points_scores_content_free_answers_on_both_tasks(tmp_path: Path, capsys) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        free_points = importlib.import_module("free_points")
    finally:
        sys.path.remove(str(BENCHMARKS))
    free_points.main(["--results", str(tmp_path)])  # no stored experiment: no untrained rows
    printed = capsys.readouterr().out
    rows = {line[:26].strip(): line[26:].split() for line in printed.splitlines()}
    assert rows["identity team"][:2] == ["14", "1.925"]  # the paper's rules: at most 2.0
    assert rows["empty functions"][:2] == ["14", "0.000"]  # no return: the reward stops
    assert rows["lead-12 + filler"][:2] == ["50", "2.232"]
    assert rows["untrained team (stored)"] == ["0", "n/a"]
