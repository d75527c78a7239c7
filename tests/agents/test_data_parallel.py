"""Data parallel training: 2 CPU processes (gloo) under torch.distributed.run against one process,
for every family.

The agents sample (tiny models, real generation): each generated row draws from its own sampling
key (item, turn, sample), so the ranks sample what one process samples. The ranks end with the
same weights bit for bit (one all-reduce of the summed gradients, identical steps); against the
one-process run they are equal up to float rounding (a rank pads and sums other batches).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from cmlrl_agents.foundation.distributed import (
    DataParallel,
    aggregate_metrics,
    shard_round,
    turn_weights,
)
from cmlrl_agents.testing import tiny_model, tiny_tokenizer

SCRIPT = Path(__file__).with_name("dp_train_script.py")
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(out: Path, nproc: int, launcher: str = "torchrun", **spec: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    arg = json.dumps({"out": str(out), "items": spec.pop("items", 8), **spec})
    if nproc == 1:
        cmd = [sys.executable, str(SCRIPT), arg]
    elif launcher == "accelerate":
        # accelerate's --cpu runs ONE process (its multi-CPU path is mpirun); --multi_gpu starts
        # torch.distributed.run, which works without a GPU: the trainer then picks gloo. No
        # config file is read (HF_HOME is the test's), so the flags are the whole launch.
        env["HF_HOME"] = str(out / "hf_home")
        cmd = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--multi_gpu",
            f"--num_processes={nproc}",
            "--num_machines=1",
            "--mixed_precision=no",
            "--dynamo_backend=no",
            f"--main_process_port={_free_port()}",
            str(SCRIPT),
            arg,
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            f"--master_port={_free_port()}",
            str(SCRIPT),
            arg,
        ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _params(out: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(out / f"params-rank{rank}.pt")


def _state(out: Path, rank: int) -> dict:
    return json.loads((out / f"metrics-rank{rank}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dp")
    single, parallel = base / "single", base / "parallel"
    _launch(single, 1, eval_items=5)
    _launch(parallel, 2, save_steps=4, eval_items=5)
    return {"single": single, "parallel": parallel, "base": base}


def assert_close_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal up to float rounding: a rank pads and sums other batches than one process, and
    AdamW turns a near-zero gradient's rounding into a step of up to its learning rate (1e-2
    here), so a few weights may differ by up to a step; another sample would move most."""
    assert got.keys() == want.keys()
    differ = sum(int(((got[n] - w).abs() > 1e-4).sum()) for n, w in want.items())
    total = sum(w.numel() for w in want.values())
    assert differ / total < 0.01, f"{differ} of {total} weights differ by more than 1e-4"
    worst = max(float((got[n] - w).abs().max()) for n, w in want.items())
    assert worst < 2e-2, worst  # at most two AdamW steps of lr 1e-2


def test_two_ranks_end_with_identical_weights_equal_to_one_process(runs) -> None:
    single, parallel = _params(runs["single"], 0), _params(runs["parallel"], 0)
    other = _params(runs["parallel"], 1)
    initial = tiny_model(len(tiny_tokenizer()), 0).state_dict()
    assert any(not torch.equal(parallel[f"agent_0.{k}"], v) for k, v in initial.items())
    for name, value in parallel.items():
        assert torch.equal(other[name], value), name  # the ranks agree exactly
    assert_close_weights(parallel, single)  # and with the one-process run


@pytest.mark.parametrize("family", ["iac", "maac", "centralized", "madpo", "marlhf"])
def test_every_family_trains_data_parallel_like_one_process(tmp_path, family) -> None:
    single, parallel = tmp_path / "single", tmp_path / "parallel"
    _launch(single, 1, family=family)
    _launch(parallel, 2, family=family)
    ranks = [_params(parallel, r) for r in (0, 1)]
    for name, value in ranks[0].items():
        assert torch.equal(ranks[1][name], value), name
    assert_close_weights(ranks[0], _params(single, 0))
    one, launch = _state(single, 0), _state(parallel, 0)
    assert launch["env_step"] == one["env_step"]
    for key in ("loss", "grad_norm"):  # the last round: the same samples, the same update
        if key in one["last"]:
            assert launch["last"][key] == pytest.approx(one["last"][key], rel=1e-3), key
    for key in ("completions/length_mean", "completions/length_max"):  # the same samples
        if key in one["last"]:
            assert launch["last"][key] == pytest.approx(one["last"][key], abs=1e-12), key


def test_batch_std_scaling_divides_by_the_rounds_std_over_every_rank(tmp_path) -> None:
    """``advantage_normalization="batch"`` (TRL's ``scale_rewards``): the std is of the whole
    round, all ranks' returns together, so two ranks train as one process does; a rank that used
    its own share's std would scale its advantages, and so its loss, otherwise."""
    group, single, parallel = tmp_path / "group", tmp_path / "single", tmp_path / "parallel"
    _launch(group, 1)
    _launch(single, 1, advantage_normalization="batch", tree_plot_interval=1)
    _launch(parallel, 2, advantage_normalization="batch", tree_plot_interval=1)
    ranks = [_params(parallel, r) for r in (0, 1)]
    for name, value in ranks[0].items():
        assert torch.equal(ranks[1][name], value), name
    assert_close_weights(ranks[0], _params(single, 0))
    one, launch = _state(single, 0)["last"], _state(parallel, 0)["last"]
    assert launch["loss"] == pytest.approx(one["loss"], rel=1e-3)
    assert launch["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-3)
    # Each state's own std trains otherwise: the comparison sees the scaling.
    by_group = _state(group, 0)["last"]
    assert abs(by_group["loss"] - one["loss"]) > 1e-2 * abs(one["loss"])
    # The drawn tree (rank 0's first item, the round's first) shows the advantages trained on:
    # the whole round's std, not rank 0's share's.
    trees = sorted((parallel / "run" / "trees").glob("*.json"))
    assert trees and [t.name for t in trees] == [
        t.name for t in sorted((single / "run" / "trees").glob("*.json"))
    ]
    drawn, want = [], []
    for tree in trees:
        drawn += [a for n in json.loads(tree.read_text())["nodes"] for a in n["advantages"]]
        nodes = json.loads((single / "run" / "trees" / tree.name).read_text())["nodes"]
        want += [a for n in nodes for a in n["advantages"]]
    assert any(abs(a) > 0.1 for a in want)
    assert drawn == pytest.approx(want, abs=1e-6)


def test_metrics_are_aggregated_over_ranks_and_files_written_by_rank_0_only(runs) -> None:
    one = _state(runs["single"], 0)
    ranks = [_state(runs["parallel"], r) for r in (0, 1)]
    assert [s["world_size"] for s in ranks] == [2, 2]
    for state in ranks:
        assert state["env_step"] == one["env_step"] == 16  # 8 items x G = 2, summed over ranks
        assert state["items_seen"] == 8
        assert state["last"].keys() == one["last"].keys()
        for key, value in one["last"].items():
            assert state["last"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    run = runs["parallel"] / "run"
    lines = (run / "metrics.jsonl").read_text().splitlines()
    train = [e for e in map(json.loads, lines) if not any(k.startswith("eval/") for k in e)]
    assert [e["env_step"] for e in train] == [8, 16]  # one writer, 2 rounds
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "checkpoint-4",
        "checkpoint-8",
    ]
    # every rank's random state is kept, each restored by its own rank
    files = sorted(p.name for p in (run / "checkpoints" / "checkpoint-4").glob("rng-*"))
    assert files == ["rng-rank0.pt", "rng-rank1.pt"]


def test_evaluation_is_sharded_over_ranks_and_equals_one_process(runs) -> None:
    """5 eval items: rank 0 generates and scores 3, rank 1 the other 2; every rank's metrics
    (standard and eval_logger's) are those of the one process that scored all 5."""
    one = _state(runs["single"], 0)
    ranks = [_state(runs["parallel"], r) for r in (0, 1)]
    assert one["eval_reward_calls"] == 5
    assert [s["eval_reward_calls"] for s in ranks] == [3, 2]
    assert one["eval"]["eval/rows"] == 5.0 and "eval/turn_1/reward_mean" in one["eval"]
    assert ranks[0]["eval"] == ranks[1]["eval"]
    for key, value in one["eval"].items():
        assert ranks[0]["eval"][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key

    def eval_lines(out: Path) -> list[dict]:
        lines = (out / "run" / "metrics.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if any(k.startswith("eval/") for k in e)]

    # The evaluations during training too (items 0 and 4), logged once, by rank 0.
    logged, alone = eval_lines(runs["parallel"]), eval_lines(runs["single"])
    assert len(logged) == 3 and [e["env_step"] for e in logged] == [e["env_step"] for e in alone]


def test_accelerate_launch_trains_like_torchrun_and_one_process(runs) -> None:
    """``accelerate launch --multi_gpu --num_processes 2`` on CPU: 2 gloo ranks, the same
    weights on both (torchrun's, exactly), close to the one-process run, the evaluation
    sharded 3 + 2."""
    out = runs["base"] / "accelerate"
    _launch(out, 2, launcher="accelerate", eval_items=5)
    torchrun = _params(runs["parallel"], 0)
    ranks = [_params(out, r) for r in (0, 1)]
    for name, value in torchrun.items():
        assert torch.equal(ranks[0][name], value) and torch.equal(ranks[1][name], value), name
    states = [_state(out, r) for r in (0, 1)]
    assert [s["world_size"] for s in states] == [2, 2]
    assert [s["eval_reward_calls"] for s in states] == [3, 2]


def test_resume_under_torchrun_restores_every_rank(runs) -> None:
    resumed = runs["base"] / "resumed"
    shutil.copytree(
        runs["parallel"] / "run" / "checkpoints" / "checkpoint-4",
        resumed / "run" / "checkpoints" / "checkpoint-4",
    )
    _launch(resumed, 2, resume=True, eval_items=5)
    straight = _params(runs["parallel"], 0)
    for rank in (0, 1):
        assert _state(resumed, rank)["items_seen"] == 8
        for name, value in _params(resumed, rank).items():
            assert torch.equal(value, straight[name]), (rank, name)


def test_shard_round_splits_each_step_window_into_contiguous_blocks() -> None:
    assert shard_round(8, 4, 0, 2) == [(0, 0), (1, 0), (4, 1), (5, 1)]
    assert shard_round(8, 4, 1, 2) == [(2, 0), (3, 0), (6, 1), (7, 1)]
    # A short last window (5 items, steps of 4): 4 = 2 + 2, then 1 = 1 + 0.
    assert shard_round(5, 4, 0, 2) == [(0, 0), (1, 0), (4, 1)]
    assert shard_round(5, 4, 1, 2) == [(2, 0), (3, 0)]
    # Every position exactly once over the ranks, windows kept.
    taken = sorted(t for r in range(3) for t in shard_round(10, 4, r, 3))
    assert taken == [(p, p // 4) for p in range(10)]
    with pytest.raises(ValueError, match="rank=2"):
        shard_round(4, 4, 2, 2)


def test_windows_give_every_rank_the_same_number_of_steps() -> None:
    assert DataParallel(0, 2).windows(5, 4) == [[0, 1], [2]]
    assert DataParallel(1, 2).windows(5, 4) == [[0, 1], []]  # no item in the last step
    assert DataParallel().windows(5, 4) == [[0, 1, 2, 3], [4]]
    assert DataParallel().shard(["a", "b", "c"], 2) == ["a", "b", "c"]


def test_one_process_aggregation_and_turn_weights() -> None:
    metrics = {"turn_1/reward_mean": 0.5, "agent_0/turn_2/expected_return": 1.0, "loss": 2.0}
    assert aggregate_metrics(DataParallel(), metrics, {}) == metrics
    assert turn_weights(metrics, {1: 8, 2: 16}) == {
        "turn_1/reward_mean": 8.0,
        "agent_0/turn_2/expected_return": 16.0,
    }


def test_bad_launcher_variables_are_refused_with_the_fix(monkeypatch) -> None:
    from cmlrl_agents.foundation import distributed

    monkeypatch.setenv("WORLD_SIZE", "two")
    distributed.data_parallel.cache_clear()
    try:
        with pytest.raises(ValueError, match="WORLD_SIZE='two'.*torchrun"):
            distributed.data_parallel()
    finally:
        distributed.data_parallel.cache_clear()
