"""The CPU threads PyTorch trains with, and a warning when the machine cannot give them.

PyTorch runs an operation on one thread per physical core by default (``OMP_NUM_THREADS``
overrides it). Its threads wait for each other at the end of every operation, so when other
processes keep the cores busy, every operation waits for the slowest thread: a small training
run took 188 s with the default threads beside one busy job, and 10 s with one thread.

``num_threads`` (every config, ``cmlrl train --threads N``) sets the count at the start of
``train()``; None keeps PyTorch's, so a run on one machine does the same arithmetic each time
(the thread count can change the order of floating-point sums, hence the last digits). In either
case ``train()`` compares the threads with the CPUs this process may run on and with how many of
those other processes keep busy, and warns once per process when they do not fit, naming the
count that would. Inter-op threads are left alone: PyTorch fixes their count at the first
parallel work, and eager training does not use them.
"""

from __future__ import annotations

import math
import os
import time
import warnings

__all__ = ["apply_num_threads", "busy_cpus_elsewhere", "oversubscription", "usable_cpus"]

_STAT = "/proc/stat"
_warned = False


def apply_num_threads(num_threads: int | None) -> int:
    """Set PyTorch's thread count (None: keep it), warn once if the machine is oversubscribed;
    the count in use."""
    import torch

    if num_threads is not None and torch.get_num_threads() != num_threads:
        torch.set_num_threads(num_threads)
    threads = torch.get_num_threads()
    global _warned
    if not _warned and threads > 1:
        message = oversubscription(threads, usable_cpus(), busy_cpus_elsewhere())
        if message is not None:
            _warned = True
            warnings.warn(message, UserWarning, stacklevel=3)
    return threads


def oversubscription(threads: int, cpus: int, busy: float) -> str | None:
    """The warning for ``threads`` PyTorch threads on ``cpus`` usable CPUs of which other
    processes keep ``busy`` busy, or None when they fit (half a CPU of slack)."""
    free = max(1, math.floor(cpus - busy + 0.5))
    if threads <= free:
        return None
    return (
        f"PyTorch uses {threads} threads, but this process may run on {cpus} CPU(s) and other "
        f"processes keep {busy:.1f} CPU(s) busy, so the threads wait for each other at every "
        f"operation and training runs several times slower. Use {free} thread(s): "
        f"num_threads={free} in the config, --threads {free} on the cmlrl command line, or "
        f"OMP_NUM_THREADS={free} in the environment."
    )


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def busy_cpus_elsewhere(window: float = 0.25) -> float:
    """How many of this process's CPUs other processes keep busy, measured over ``window``
    seconds from ``/proc/stat`` (this process's own CPU time taken off); elsewhere the
    one-minute load average (0 where there is none)."""
    if not os.path.exists(_STAT):
        return max(0.0, os.getloadavg()[0] - 1) if hasattr(os, "getloadavg") else 0.0
    cpus = (
        {f"cpu{i}" for i in os.sched_getaffinity(0)} if hasattr(os, "sched_getaffinity") else None
    )
    before, own_before = _cpu_times(cpus), time.process_time()
    time.sleep(window)
    after, own_after = _cpu_times(cpus), time.process_time()
    busy, total = after[0] - before[0], after[1] - before[1]
    if total <= 0:
        return 0.0
    count = len(cpus) if cpus is not None else usable_cpus()
    others = busy / total * count - (own_after - own_before) / window
    return max(0.0, others)


def _cpu_times(cpus: set[str] | None) -> tuple[int, int]:
    """(busy, total) jiffies summed over ``cpus`` (None: all); idle and iowait are not busy."""
    busy = total = 0
    with open(_STAT, encoding="ascii") as stat:
        for line in stat:
            name, *values = line.split()
            if not name.startswith("cpu") or name == "cpu" or (cpus and name not in cpus):
                continue
            ticks = [int(v) for v in values[:8]]  # user nice system idle iowait irq softirq steal
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total
