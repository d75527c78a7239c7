"""Whether transparent huge pages cut the cost of touching fresh memory here: 1.08 GB (one
SmolLM2-135M agent's AdamW moments) made six times per mode, keeping at most two blocks, as
torch.zeros ("zeros"), as an anonymous mmap zeroed through a tensor ("mmap"), and as the same
mmap with madvise(MADV_HUGEPAGE) first ("thp"; this kernel's THP setting is "madvise").
Prints each block's process CPU and wall seconds and its minor page faults.

    for m in zeros thp mmap thp zeros; do
        OMP_NUM_THREADS=1 taskset -c 1 python results/round-time-amd-avx512/first_touch_thp.py $m
    done
"""

import mmap
import resource
import sys
import time

import torch

mode = sys.argv[1]
n = 270_000_000
kept = []
for i in range(6):
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    cpu, wall = time.process_time(), time.perf_counter()
    if mode == "zeros":
        block = torch.zeros(n)
    else:
        mm = mmap.mmap(-1, n * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if mode == "thp":
            mm.madvise(mmap.MADV_HUGEPAGE)
        block = torch.frombuffer(mm, dtype=torch.float32)
        block.zero_()
    seconds = time.process_time() - cpu, time.perf_counter() - wall
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    took = f"cpu {seconds[0]:.3f} s, wall {seconds[1]:.3f} s, faults {f1 - f0}"
    print(f"{mode} {i}: {took}", flush=True)
    kept.append(block)
    if i % 2:
        kept.pop(0)
