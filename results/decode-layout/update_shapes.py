"""oneDNN's linear on a packed weight against nn.Linear (MKL) at the update's row counts, for
SmolLM2-135M's weight shapes: is packing worth it beyond decoding? One thread, process CPU
time, best of 3 runs of 5 calls each.

    OMP_NUM_THREADS=1 taskset -c 0 python results/decode-layout/update_shapes.py
"""

import time
from collections.abc import Callable
from functools import partial

import torch


def best_seconds(call: Callable[[], object], calls: int = 5) -> float:
    call()
    best = float("inf")
    for _ in range(3):
        start = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - start) / calls)
    return best


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch's CPU kernels: {torch.backends.cpu.get_cpu_capability()}")
    for out_features, in_features in [(1536, 576), (576, 1536), (49152, 576)]:
        for rows in [64, 256, 512]:
            x = torch.randn(rows, in_features)
            weight = torch.randn(out_features, in_features)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
            mkl = best_seconds(partial(torch.nn.functional.linear, x, weight))
            pointwise = torch.ops.mkldnn._linear_pointwise
            onednn = best_seconds(partial(pointwise, x, packed, None, "none", [], ""))
            flop = 2 * rows * in_features * out_features
            print(
                f"[{out_features}, {in_features}] x {rows} rows: MKL {mkl * 1e3:.2f} ms "
                f"({flop / mkl / 1e9:.0f} GFLOP/s), oneDNN packed {onednn * 1e3:.2f} ms "
                f"({flop / onednn / 1e9:.0f} GFLOP/s), ratio {onednn / mkl:.2f}"
            )


if __name__ == "__main__":
    main()
