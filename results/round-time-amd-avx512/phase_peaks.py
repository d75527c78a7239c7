"""The peak resident memory of each phase of the 1-turn `vs_comlrl.py` workload
(`results/weight-gradients/vs_workload.py`; SETUP=lora for its adapter agents): a thread reads
the process's RSS every 2 ms and files it under the call running then (`generate_rows`,
`Tensor.backward`, `AdamW.step`, else "other", which holds the update's forward passes).

    ITEMS=4 OMP_NUM_THREADS=1 taskset -c 1 \
        python results/round-time-amd-avx512/phase_peaks.py /tmp/run
"""

import os
import runpy
import sys
import threading
import time
from pathlib import Path

import torch

from cmlrl_agents.policies import agent as agent_module

WORKLOAD = Path(__file__).resolve().parents[1] / "weight-gradients" / "vs_workload.py"
phase = ["other"]
peaks: dict[str, int] = {}
PAGE = os.sysconf("SC_PAGE_SIZE")


def sample() -> None:
    while True:
        with open("/proc/self/statm") as statm:
            rss = int(statm.read().split()[1]) * PAGE
        peaks[phase[0]] = max(peaks.get(phase[0], 0), rss)
        time.sleep(0.002)


def tagged(owner: object, name: str, tag: str) -> None:
    call = getattr(owner, name)

    def inside(*args: object, **kwargs: object) -> object:
        before, phase[0] = phase[0], tag
        try:
            return call(*args, **kwargs)
        finally:
            phase[0] = before

    setattr(owner, name, inside)


tagged(agent_module.LLMAgent, "generate_rows", "generate")
tagged(torch.Tensor, "backward", "backward")
tagged(torch.optim.AdamW, "step", "AdamW.step")
threading.Thread(target=sample, daemon=True).start()
sys.argv = [str(WORKLOAD), sys.argv[1]]
runpy.run_path(str(WORKLOAD), run_name="__main__")
print("peak GB by phase:", {k: round(v / 1e9, 2) for k, v in sorted(peaks.items())})
