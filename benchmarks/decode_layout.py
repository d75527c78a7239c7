"""Decoding with prepared weights (``policies/decode_layout.py``) against without.

Two measurements, each in alternating order in one process, so that every side shares the
machine's load:
- the matrix products alone: ``nn.Linear`` against ``x @ W_t`` (the ``[in, out]`` copy) and
  against oneDNN's linear on the weight packed for it, for SmolLM2-135M's weight shapes at
  ``--rows`` rows (median microseconds of ``--repeats`` x 50 calls; warm caches, so they favour
  neither side's memory traffic);
- whole ``generate`` calls of SmolLM2-135M-Instruct (local, SPEC §9) on the seed's length-ratio
  prompts in the chat template (detailed formatter), ``--tokens`` forced tokens, 2 prompts x
  ``rows / 2`` samples, the library's sampling defaults, a key per row: process CPU seconds per
  decoding step with every linear layer's copy, with the output layer packed, with every layer
  packed (each side's preparing included) and without any, and whether each sampled the tokens
  of "without".

With ``--update-rows`` it also times the same weight shapes at the update's row counts
(``nn.Linear``, MKL, against oneDNN on a weight packed for that many rows; process CPU time,
best of ``--repeats`` runs of 5 calls): whether packing would pay beyond decoding.
``--skip-generation`` leaves out the ``generate`` calls (and the model).

The library chooses by the CPU (``decode_weights``: the copies where torch runs its AVX-512
kernels, except on AMD CPUs, which pack every layer; the output layer packed with its AVX2
kernels); the header says which kernels and vendor this machine has and which the library uses,
and each side is forced whatever it says.

    OMP_NUM_THREADS=1 python benchmarks/decode_layout.py --threads 1 --rows 8 16 32
    OMP_NUM_THREADS=1 python benchmarks/decode_layout.py --rows 8 --update-rows 64 256 512 \
        --repeats 3 --skip-generation
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from unittest import mock

import torch
from option_checks import refuse_below_one

from cmlrl_agents.policies import agent as agent_module
from cmlrl_agents.policies import decode_layout as layout
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.gguf import smollm2_path
from cmlrl_agents.policies.sampling import row_key
from cmlrl_env import tasks

SHAPES = {"MLP up/gate": (1536, 576), "MLP down": (576, 1536), "output layer": (49152, 576)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument(
        "--update-rows", type=int, nargs="*", default=[], help="the update's row counts to time"
    )
    parser.add_argument("--skip-generation", action="store_true")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="default: the local SmolLM2 folder")
    args = parser.parse_args(argv)
    refuse_below_one(parser, args, ("tokens", "repeats", "threads"))
    if any(r < 1 for r in args.update_rows):
        parser.error(f"--update-rows must be at least 1, got {args.update_rows}")
    if any(r < 2 or r % 2 for r in args.rows):
        parser.error(f"--rows must be even numbers of at least 2 (2 prompts), got {args.rows}")
    return args


def _micro(call: Callable[[], object], repeats: int) -> float:
    """Median microseconds per call over ``repeats`` runs of 50 calls."""
    call()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(50):
            call()
        runs.append((time.perf_counter() - start) / 50 * 1e6)
    return statistics.median(runs)


def _best_cpu_seconds(call: Callable[[], object], repeats: int) -> float:
    """Least process CPU seconds per call over ``repeats`` runs of 5 calls (products of
    milliseconds: the least loaded run is the kernel's own speed)."""
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(5):
            call()
        best = min(best, (time.process_time() - start) / 5)
    return best


def products(rows: list[int], repeats: int) -> None:
    packing = layout.onednn_linear()
    print(
        "matrix products, warm caches (µs per call): nn.Linear, x @ W_t (ratio)"
        + (", oneDNN packed (ratio)" if packing else "")
    )
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features)
        weight_t = weight.t().contiguous()
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 8) if packing else None
        for m in rows:
            x = torch.randn(m, in_features)
            plain = _micro(partial(torch.nn.functional.linear, x, weight), repeats)
            copied = _micro(partial(torch.matmul, x, weight_t), repeats)
            line = (
                f"  {name:13s} [{out_features}, {in_features}] x {m:3d} rows: "
                f"{plain:8.0f}  {copied:8.0f} ({copied / plain:4.2f}x)"
            )
            if packed is not None:
                pointwise = torch.ops.mkldnn._linear_pointwise
                onednn = _micro(partial(pointwise, x, packed, None, "none", [], ""), repeats)
                line += f"  {onednn:8.0f} ({onednn / plain:4.2f}x)"
            print(line)


def update_products(rows: list[int], repeats: int) -> None:
    print(
        "the update's row counts (process CPU ms per call, best run): nn.Linear (MKL), "
        "oneDNN on a weight packed for that many rows (ratio)"
    )
    pointwise = torch.ops.mkldnn._linear_pointwise
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features)
        for m in rows:
            x = torch.randn(m, in_features)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, m)
            mkl = _best_cpu_seconds(partial(torch.nn.functional.linear, x, weight), repeats)
            onednn = _best_cpu_seconds(partial(pointwise, x, packed, None, "none", [], ""), repeats)
            gflop = 2 * m * in_features * out_features / 1e9
            print(
                f"  {name:13s} [{out_features}, {in_features}] x {m:3d} rows: "
                f"{mkl * 1e3:8.2f} ({gflop / mkl:3.0f} GFLOP/s)  {onednn * 1e3:8.2f} "
                f"({gflop / onednn:3.0f} GFLOP/s, {onednn / mkl:4.2f}x)"
            )


def _side(name: str) -> AbstractContextManager[object]:
    """The library's decoding path forced to one layout: ``name`` is "without" (no layout at
    all) or one of ``decode_weights``' answers ("copies", "packed_output", "packed")."""
    if name == "without":
        return mock.patch.object(
            agent_module, "decode_layout", lambda model, sequences: nullcontext()
        )
    return mock.patch.object(layout, "decode_weights", lambda: name)


def generation(agent: LLMAgent, rows: list[int], tokens: int, repeats: int) -> None:
    items = tasks.length_ratio_dataset().select(range(2))
    prompts = [tasks.detailed_formatter(item) for item in items]
    sampling = SamplingConfig(max_new_tokens=tokens, min_new_tokens=tokens)
    sides = ["without", "copies"]
    sides += ["packed_output", "packed"] if layout.onednn_linear() else []
    print(
        f"generate, {tokens} forced tokens (process CPU ms per decoding step): without, "
        "every layer copied, the output layer packed, every layer packed (ratios to without)"
    )
    for m in rows:
        keys = [row_key(0, p, g) for p in range(2) for g in range(m // 2)]
        seconds: dict[str, list[float]] = {side: [] for side in sides}
        tokens_of: dict[str, list[tuple[int, ...]]] = {}
        for _ in range(repeats):
            for side in sides:
                with _side(side):
                    start = time.process_time()
                    out = agent.generate(prompts, m // 2, sampling, keys=keys)
                    seconds[side].append(time.process_time() - start)
                tokens_of[side] = [c.completion_ids for row in out for c in row]
        per_step = {side: statistics.median(seconds[side]) / tokens * 1e3 for side in sides}
        line = f"  {m:3d} rows: without {per_step['without']:6.1f}"
        for side in sides[1:]:
            same = tokens_of[side] == tokens_of["without"]
            ratio = per_step[side] / per_step["without"]
            line += f", {side} {per_step[side]:6.1f} ({ratio:.2f}x, same tokens: {same})"
        print(line)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}, rows {args.rows}, tokens {args.tokens}")
    print(
        f"torch's CPU kernels: {torch.backends.cpu.get_cpu_capability()}; CPU vendor: "
        f"{layout.cpu_vendor() or 'not reported'}; the library's decoding weights here: "
        f"{layout.decode_weights()}"
    )
    products(args.rows, args.repeats)
    if args.update_rows and layout.onednn_linear():
        update_products(args.update_rows, args.repeats)
    elif args.update_rows:
        print("the update's row counts: not timed, this torch has no oneDNN linear")
    if args.skip_generation:
        return
    agent = LLMAgent.from_pretrained(args.model or str(smollm2_path()))
    agent.generate(["warm up"], 1, SamplingConfig(max_new_tokens=2))
    generation(agent, args.rows, args.tokens, args.repeats)


if __name__ == "__main__":
    main()
