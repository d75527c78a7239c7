"""PyTorch's thread count: the config's ``num_threads`` applied at ``train()``, and one warning
when the machine is oversubscribed, with the count that fits."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.cli.commands import main
from cmlrl_agents.runs import threads
from cmlrl_agents.testing import tiny_agent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def torch_threads():
    """A fresh once-per-process flag (an earlier run may have warned already), and PyTorch's
    thread count and the flag restored after the test."""
    before = torch.get_num_threads()
    threads._warned = False
    yield
    torch.set_num_threads(before)
    threads._warned = False


def test_threads_that_fit_the_free_cpus_give_no_warning() -> None:
    assert threads.oversubscription(2, 2, 0.4) is None  # 1.6 CPUs free: 2 threads fit
    assert threads.oversubscription(4, 8, 2.0) is None
    assert threads.oversubscription(1, 2, 5.0) is None  # one thread cannot do better


def test_oversubscription_names_the_count_that_fits() -> None:
    message = threads.oversubscription(8, 8, 2.0)
    assert message is not None and "Use 6 thread(s): num_threads=6 in the config" in message
    message = threads.oversubscription(2, 2, 3.9)  # the newcomer's case: a busy 2-core box
    assert message == (
        "PyTorch uses 2 threads, but this process may run on 2 CPU(s) and other processes keep "
        "3.9 CPU(s) busy, so the threads wait for each other at every operation and training "
        "runs several times slower. Use 1 thread(s): num_threads=1 in the config, --threads 1 "
        "on the cmlrl command line, or OMP_NUM_THREADS=1 in the environment."
    )


def test_busy_cpus_come_from_proc_stat_less_this_process(monkeypatch, tmp_path) -> None:
    stat = tmp_path / "stat"
    # cpu0 and cpu1: (user nice system idle iowait irq softirq steal); the "cpu" sum is skipped
    stat.write_text(
        "cpu  9 9 9 9 9 9 9 9\ncpu0 100 0 0 100 0 0 0 0\ncpu1 0 0 0 200 0 0 0 0\nintr 5\n"
    )
    monkeypatch.setattr(threads, "_STAT", str(stat))
    assert threads._cpu_times({"cpu0", "cpu1"}) == (100, 400)
    assert threads._cpu_times({"cpu1"}) == (0, 200)

    def sleep(seconds: float) -> None:  # 0.25 s pass: cpu0 busy 100 of 100 ticks, cpu1 50 of 100
        stat.write_text("cpu0 200 0 0 100 0 0 0 0\ncpu1 0 0 50 250 0 0 0 0\n")

    clock = iter([10.0, 10.05])  # this process used 0.05 CPU s of the 0.25 s
    monkeypatch.setattr(threads.time, "sleep", sleep)
    monkeypatch.setattr(threads.time, "process_time", lambda: next(clock))
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1})
    # 150 busy of 200 ticks on 2 CPUs = 1.5 CPUs, less 0.05 / 0.25 = 0.2 of ours
    assert threads.busy_cpus_elsewhere(0.25) == pytest.approx(1.3)


def test_apply_sets_the_count_and_warns_once(monkeypatch, torch_threads) -> None:
    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr(threads, "busy_cpus_elsewhere", lambda: 3.9)
    with pytest.warns(UserWarning, match="PyTorch uses 2 threads") as caught:
        assert threads.apply_num_threads(2) == 2
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert threads.apply_num_threads(2) == 2  # once per process
        assert threads.apply_num_threads(None) == 2  # None keeps the count
        assert threads.apply_num_threads(1) == 1 and torch.get_num_threads() == 1


def test_train_applies_the_configs_num_threads(tmp_path, torch_threads) -> None:
    torch.set_num_threads(2)
    args = MAGRPOConfig(
        num_agents=2,
        num_generations=2,
        max_new_tokens=4,
        eval_interval=0,
        num_threads=1,
        output_dir=str(tmp_path / "run"),
    )
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        reward_func=lambda a, b: [float(len(x) < len(y)) for x, y in zip(a, b, strict=True)],
        train_dataset=Dataset.from_dict({"prompt": ["p0", "p1"]}),
        args=args,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    assert torch.get_num_threads() == 1


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_num_threads_is_checked_in_python_and_on_the_command_line(bad, capsys) -> None:
    with pytest.raises((TypeError, ValueError), match="num_threads must be"):
        MAGRPOConfig(num_threads=bad)
    tiny = ROOT / "examples" / "configs" / "tiny.yaml"
    assert main(["check", str(tiny), "--threads", str(bad)]) == 2
    expected = "num_threads must be" if isinstance(bad, int) else "invalid int value: '1.5'"
    assert expected in capsys.readouterr().err


def test_the_guide_shows_the_warning_as_it_is_printed() -> None:
    text = (ROOT / "docs" / "experiments.md").read_text(encoding="utf-8")
    shown = text.split("```text\nUserWarning: ")[1].split("\n```")[0]
    head, tail = (" ".join(part.split()) for part in shown.split("..."))
    message = threads.oversubscription(2, 2, 3.9)
    assert message is not None and message.startswith(head) and message.endswith(tail)
