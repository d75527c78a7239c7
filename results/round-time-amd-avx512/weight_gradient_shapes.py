"""The update's weight-gradient products (``grad_output.T @ input`` at 248 rows) for SmolLM2's
MLP and output-layer weights, outside a round: into a fresh tensor (as autograd does), into one
kept from call to call (``out=``), and two other ways to order them; process CPU ms per call,
GFLOP per CPU s and the page faults each call took. Inside a round the MLP's ran at 33-36
GFLOP/s (`ops-of-round-2-6-items.txt`); here the heap gives the fresh tensor memory it has
already touched, which is the difference.

    OMP_NUM_THREADS=1 taskset -c 1 python results/round-time-amd-avx512/weight_gradient_shapes.py
"""

import resource
import time
from collections.abc import Callable

import torch

ROWS = 248


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(call: Callable[[], object], calls: int) -> tuple[float, float]:
    for _ in range(3):
        call()
    before, start = faults(), time.process_time()
    for _ in range(calls):
        call()
    return (time.process_time() - start) / calls, (faults() - before) / calls


def shape(out_features: int, in_features: int) -> None:
    grad, x = torch.randn(ROWS, out_features), torch.randn(ROWS, in_features)
    kept = torch.empty(out_features, in_features)
    flop = 2 * out_features * in_features * ROWS
    ways: dict[str, Callable[[], object]] = {
        "grad.T @ x, fresh": lambda: grad.t() @ x,
        "mm(grad.T, x, out=kept)": lambda: torch.mm(grad.t(), x, out=kept),
        "(x.T @ grad).T, fresh": lambda: (x.t() @ grad).t(),
        "grad.T copied, then @ x": lambda: grad.t().contiguous() @ x,
    }
    for name, call in ways.items():
        seconds, per_call = timed(call, 10 if out_features > 10000 else 30)
        print(
            f"[{out_features}, {in_features}] {name:26s} {seconds * 1e3:8.2f} ms "
            f"{flop / seconds / 1e9:6.1f} GFLOP/s  faults per call {per_call:.0f}"
        )


torch.set_num_threads(1)
for out_features, in_features in [(1536, 576), (576, 1536), (49152, 576)]:
    shape(out_features, in_features)
