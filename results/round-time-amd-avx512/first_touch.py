"""What touching fresh memory costs here: zero 1.08 GB (the AdamW moments of one SmolLM2-135M
agent) eight times, keeping at most two blocks, and print each one's process CPU and wall
seconds and the process's minor page faults so far.

    OMP_NUM_THREADS=1 taskset -c 1 python results/round-time-amd-avx512/first_touch.py
"""

import resource
import time

import torch

kept = []
for i in range(8):
    cpu, wall = time.process_time(), time.perf_counter()
    block = torch.zeros(270_000_000)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = time.process_time() - cpu, time.perf_counter() - wall
    print(f"{i}: cpu {seconds[0]:.2f} s, wall {seconds[1]:.2f} s, faults {faults}")
    kept.append(block)
    if i % 2:
        kept.pop(0)
