"""The 1-turn `vs_comlrl.py` workload (`results/weight-gradients/vs_workload.py`) with the
decoding weights forced (DECODE = packed, packed_output, as_is; see
`cmlrl_agents/policies/decode_layout.py`), to see whether packing still pays inside a round,
where each `generate` call packs into memory the update has just handed back: the CPU seconds
of the `generate_rows` calls (packing included), the page faults and the peak RSS.

    for d in packed packed_output as_is as_is packed_output packed; do
        DECODE=$d ITEMS=8 OMP_NUM_THREADS=1 taskset -c 1 \
            python results/round-time-amd-avx512/decode_in_round.py /tmp/run-$d-$RANDOM
    done
"""

import os
import resource
import runpy
import sys
import time
from pathlib import Path

from cmlrl_agents.policies import agent as agent_module
from cmlrl_agents.policies import decode_layout as layout

WORKLOAD = Path(__file__).resolve().parents[1] / "weight-gradients" / "vs_workload.py"
choice = os.environ["DECODE"]
layout.decode_weights = lambda: choice  # type: ignore[assignment, return-value]
generate_cpu = [0.0]
generate_rows = agent_module.LLMAgent.generate_rows


def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
    start = time.process_time()
    try:
        return generate_rows(*args, **kwargs)
    finally:
        generate_cpu[0] += time.process_time() - start


agent_module.LLMAgent.generate_rows = timed  # type: ignore[method-assign]
sys.argv = [str(WORKLOAD), sys.argv[1]]
runpy.run_path(str(WORKLOAD), run_name="__main__")
usage = resource.getrusage(resource.RUSAGE_SELF)
print(
    f"RESULT decode={choice} generate_cpu={generate_cpu[0]:.2f} faults={usage.ru_minflt} "
    f"peak_gb={usage.ru_maxrss / 1e6:.2f}"
)
