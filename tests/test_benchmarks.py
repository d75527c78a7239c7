"""The benchmark scripts parse their settings and run end to end on a tiny model (no timings
are asserted: benchmarks are outside the test suite's claims)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from cmlrl_agents.testing import tiny_model, tiny_tokenizer

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import their shared helper module
    try:
        yield {name: importlib.import_module(name) for name in ("floor", "learning", "vs_comlrl")}
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_learning_defaults_are_the_issue_settings(bench) -> None:
    args = bench["learning"].parse_args([])
    assert (args.items, args.epochs, args.eval_repeats) == (8, 2, 4)
    assert args.lr is None and args.comlrl_lr is None and args.only is None
    short = bench["learning"].parse_args(["--items", "2", "--epochs", "1", "--only", "cmlrl"])
    assert (short.items, short.epochs, short.only) == (2, 1, "cmlrl")


@pytest.mark.parametrize("module", ["learning", "floor"])
def test_counts_below_one_are_refused(bench, module: str, capsys) -> None:
    with pytest.raises(SystemExit):
        bench[module].parse_args(["--items", "0"])
    assert "--items must be at least 1" in capsys.readouterr().err


def test_vs_comlrl_uses_the_shared_helpers(bench) -> None:
    helpers = importlib.import_module("reference_env")
    assert bench["vs_comlrl"].reference_python is helpers.reference_python
    assert bench["vs_comlrl"].run is helpers.run_child


def test_floor_runs_one_round_of_each_on_a_tiny_model(bench, tmp_path: Path, capsys) -> None:
    tokenizer = tiny_tokenizer()
    tiny_model(len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    best = bench["floor"].main(
        ["--model", str(tmp_path), "--items", "2", "--tokens", "3", "--repeats", "1"]
    )
    assert set(best) == {"floor", "train", "round"}
    assert all(seconds > 0 for seconds in best.values())
    assert "x the floor" in capsys.readouterr().out
