"""Count and time the expensive calls of any training script: compare two trees on one workload.

Wraps the model forwards (split into generation, with-gradient and no-gradient passes, with the
batch shapes of the scoring passes), ``Tensor.backward``, ``AdamW.step``, ``generate`` and the
trainer's evaluation and round functions where the tree has them, then runs the script and
prints each one's call count, wall and process-CPU seconds and minor page faults at exit. On a
shared machine CPU seconds and counts are the figures to compare; run the two trees side by
side on one workload (the same seed gives the same completions, so the counts must agree):

    PYTHONPATH=/path/to/old OMP_NUM_THREADS=1 python benchmarks/profile_calls.py \\
        examples/length_ratio.py --epochs 1 --eval-repeats 1 --output-dir /tmp/old-run

Options before the script: ``--timeline`` also prints each wrapped call as it ends (when it
began, how long it took), so a first round's one-time costs show against the later rounds';
``--keep-freed-memory`` makes glibc's malloc keep freed blocks in the process (``mallopt``:
``M_MMAP_THRESHOLD`` 32 MiB, its largest, and ``M_TRIM_THRESHOLD`` 2 GiB) before the script
runs, to measure what the page faults of memory handed back and taken again cost;
``--ops-of-round N`` runs the N-th training round (from 1) under ``torch.profiler`` and prints
its 40 costliest operator calls by self CPU time, grouped by input shapes (with
``--ops-by-memory``, by the memory they allocate instead: where a round's fresh memory, and so
its page faults, come from). The report ends
with the process's user and system CPU seconds, minor page faults and peak RSS.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import importlib
import platform
import resource
import runpy
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

STATS: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0])  # calls, wall, cpu, faults
SHAPES: Counter[tuple[str, tuple[int, ...]]] = Counter()
TIMELINE: list[float] = []  # [start of the run] once --timeline is on
TIMED = ("generate", "backward", "AdamW.step", "MAGRPOTrainer round")


def _faults() -> int:
    """The process's minor page faults so far: memory touched for the first time since the
    allocator took it from the kernel (on a virtual machine each can cost microseconds)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _marks() -> tuple[float, float, int]:
    """Wall clock, process CPU time and page faults now: a wrapped call's start."""
    return time.perf_counter(), time.process_time(), _faults()


def _record(key: str, wall: float, cpu: float, faults: int) -> None:
    took = time.perf_counter() - wall
    new_faults = _faults() - faults
    entry = STATS[key]
    entry[0] += 1
    entry[1] += took
    entry[2] += time.process_time() - cpu
    entry[3] += new_faults
    if TIMELINE and key in TIMED:
        print(
            f"{key:24s} at {wall - TIMELINE[0]:8.2f} s  took {took:7.3f} s  faults {new_faults:8d}",
            file=sys.stderr,
        )


def wrap(owner: Any, name: str, key: str) -> None:
    """Replace ``owner.name`` by a counting, timing wrapper (nothing when the tree lacks it)."""
    original = getattr(owner, name, None)
    if original is None:
        return

    def timed(*args: Any, **kwargs: Any) -> Any:
        wall, cpu, faults = _marks()
        try:
            return original(*args, **kwargs)
        finally:
            _record(key, wall, cpu, faults)

    setattr(owner, name, timed)


def wrap_forward(model_class: type) -> None:
    """Time ``model_class.forward`` by mode; record the shapes of the non-generation passes."""
    original: Callable[..., Any] = model_class.forward

    # wraps: the library reads the forward's signature (logits_to_keep, the cache keyword); a
    # bare (*args, **kwargs) wrapper would turn those paths off and profile another program.
    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        wall, cpu, faults = _marks()
        ids = kwargs.get("input_ids", args[0] if args else None)
        if torch.is_inference_mode_enabled():
            mode = "forward/generation"
        else:
            mode = "forward/grad" if torch.is_grad_enabled() else "forward/no_grad"
        try:
            return original(self, *args, **kwargs)
        finally:
            _record(mode, wall, cpu, faults)
            if ids is not None and mode != "forward/generation":
                SHAPES[(mode, tuple(ids.shape))] += 1

    model_class.forward = forward


def install() -> None:
    from transformers import GenerationMixin
    from transformers.models.llama import modeling_llama

    wrap_forward(modeling_llama.LlamaForCausalLM)
    wrap(torch.Tensor, "backward", "backward")
    wrap(torch.optim.AdamW, "step", "AdamW.step")
    wrap(GenerationMixin, "generate", "generate")
    magrpo = tree_module("algorithms.magrpo", "magrpo")
    trainer_base = tree_module("runs.trainer", "trainer_base")
    wrap(trainer_base.TeamTrainer, "evaluate_items", "TeamTrainer.evaluate_items")
    wrap(magrpo.MAGRPOTrainer, "_train_batch", "MAGRPOTrainer round")  # trees before 10b
    wrap(magrpo.MAGRPOTrainer, "_train_round", "MAGRPOTrainer round")
    logging_module = tree_module("runs.logging", "logging")
    wrap(logging_module.MetricsLogger, "log_train", "MetricsLogger.log_train")
    try:
        learners = tree_module("algorithms.policy_gradient", "policy_gradient")
    except ImportError:  # a tree from before the learners
        return
    wrap(learners.PolicyGradientLearner, "update", "PolicyGradientLearner.update")


def tree_module(path: str, flat: str) -> Any:
    """``cmlrl_agents.<path>``, or ``cmlrl_agents.<flat>`` in a tree from before the
    sub-packages, so that one copy of this script profiles old and new trees alike."""
    import cmlrl_agents

    # Looked up in the tree's own folder: an editable install elsewhere could otherwise serve a
    # sub-package of another tree.
    root = Path(cmlrl_agents.__file__).parent
    name = path if (root / f"{path.replace('.', '/')}.py").is_file() else flat
    if not (root / f"{name.replace('.', '/')}.py").is_file():
        raise ImportError(f"{root} has neither {path} nor {flat}")
    return importlib.import_module(f"cmlrl_agents.{name}")


def report(start_wall: float, start_cpu: float) -> None:
    out = sys.stderr
    print(f"torch threads {torch.get_num_threads()}", file=out)
    total_wall, total_cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
    print(f"TOTAL wall {total_wall:.1f} s, cpu {total_cpu:.1f} s", file=out)
    for key, (calls, wall, cpu, faults) in sorted(STATS.items(), key=lambda kv: -kv[1][2]):
        print(
            f"{key:32s} calls {calls:6d}  wall {wall:8.1f} s  cpu {cpu:8.1f} s  faults {faults:9d}",
            file=out,
        )
    for (mode, shape), count in sorted(SHAPES.items()):
        print(f"{mode:20s} input_ids {shape} x{count}", file=out)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"process: user {usage.ru_utime:.1f} s, system {usage.ru_stime:.1f} s, "
        f"minor page faults {usage.ru_minflt}, peak RSS {usage.ru_maxrss / 1024**2:.2f} GB",
        file=out,
    )


def profile_round(number: int, by_memory: bool = False) -> None:
    """Run round ``number`` (from 1) under ``torch.profiler``; print its costliest operators
    by self CPU time, or by the memory they allocate (``by_memory``)."""
    from torch.profiler import ProfilerActivity, profile

    trainer = tree_module("algorithms.magrpo", "magrpo").MAGRPOTrainer
    # trees before 10b named the round _train_batch
    name = "_train_round" if hasattr(trainer, "_train_round") else "_train_batch"
    original = getattr(trainer, name)
    seen = [0]

    @functools.wraps(original)
    def round_(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] != number:
            return original(self, *args, **kwargs)
        with profile(
            activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=by_memory
        ) as prof:
            result = original(self, *args, **kwargs)
        sort_by, what = (
            ("self_cpu_memory_usage", "memory")
            if by_memory
            else ("self_cpu_time_total", "CPU time")
        )
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by=sort_by, row_limit=40, max_name_column_width=40
        )
        print(f"round {number}, operators by self {what}:\n{table}", file=sys.stderr)
        return result

    setattr(trainer, name, round_)


def keep_freed_memory() -> None:
    """glibc's malloc keeps freed blocks up to 32 MiB and 2 GiB of free heap top for reuse."""
    if platform.libc_ver()[0] != "glibc":
        sys.exit("--keep-freed-memory needs glibc's malloc (mallopt)")
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    if not (libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 2**31 - 1)):
        sys.exit("mallopt refused the thresholds")


def main() -> None:
    args = sys.argv[1:]
    usage = (
        "usage: python benchmarks/profile_calls.py [--timeline] [--keep-freed-memory] "
        "[--ops-of-round N [--ops-by-memory]] SCRIPT [ARGS...]"
    )
    given: set[str] = set()
    ops_round = None
    options = {"--timeline", "--keep-freed-memory", "--ops-of-round", "--ops-by-memory"}
    while args and args[0] in options:
        option = args.pop(0)
        if option == "--ops-of-round":
            if not args or not args[0].isdigit() or int(args[0]) < 1:
                sys.exit(f"--ops-of-round takes a round number from 1; {usage}")
            ops_round = int(args.pop(0))
        given.add(option)
    if args and args[0] in ("-h", "--help"):
        print(f"{usage}\n\n{__doc__}")
        return
    if not args or args[0].startswith("-"):
        sys.exit(f"no script to run (an unknown option?); {usage}")
    if "--ops-by-memory" in given and ops_round is None:
        sys.exit(f"--ops-by-memory sorts the operators of --ops-of-round N; give both. {usage}")
    if "--keep-freed-memory" in given:
        keep_freed_memory()
    install()
    if ops_round is not None:
        profile_round(ops_round, by_memory="--ops-by-memory" in given)
    start = time.perf_counter()
    if "--timeline" in given:
        TIMELINE.append(start)
    atexit.register(report, start, time.process_time())
    sys.argv = args
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
