"""Decoding with ``[in, out]`` weight copies (``policies/decode_layout.py``) against without.

Two measurements, each in alternating order in one process, so that both sides share the
machine's load:
- the matrix products alone: ``nn.Linear`` against ``x @ W_t`` for SmolLM2-135M's weight
  shapes at ``--rows`` rows (median microseconds of ``--repeats`` x 50 calls; warm caches, so
  they favour neither side's memory traffic);
- whole ``generate`` calls of SmolLM2-135M-Instruct (local, SPEC §9) on the seed's length-ratio
  prompts in the chat template (detailed formatter), ``--tokens`` forced tokens, 2 prompts x
  ``rows / 2`` samples, the library's sampling defaults, a key per row: process CPU seconds per
  decoding step with the copies (their making included) and without them, and whether the two
  sampled the same tokens.

The library makes the copies only where torch runs its AVX-512 kernels (``copies_pay_off``); the
header says which kernels this machine runs, and "with copies" makes them whatever it says.

    OMP_NUM_THREADS=1 python benchmarks/decode_layout.py --threads 1 --rows 8 16 32
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from unittest import mock

import torch

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
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="default: the local SmolLM2 folder")
    args = parser.parse_args(argv)
    for name in ("tokens", "repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
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


def products(rows: list[int], repeats: int) -> None:
    print("matrix products, warm caches (µs per call): nn.Linear, x @ W_t, ratio")
    for name, (out_features, in_features) in SHAPES.items():
        weight = torch.randn(out_features, in_features)
        weight_t = weight.t().contiguous()
        for m in rows:
            x = torch.randn(m, in_features)
            plain = _micro(partial(torch.nn.functional.linear, x, weight), repeats)
            copied = _micro(partial(torch.matmul, x, weight_t), repeats)
            print(
                f"  {name:13s} [{out_features}, {in_features}] x {m:3d} rows: "
                f"{plain:8.0f}  {copied:8.0f}  {copied / plain:5.2f}x"
            )


def generation(agent: LLMAgent, rows: list[int], tokens: int, repeats: int) -> None:
    items = tasks.length_ratio_dataset().select(range(2))
    prompts = [tasks.detailed_formatter(item) for item in items]
    sampling = SamplingConfig(max_new_tokens=tokens, min_new_tokens=tokens)
    print(f"generate, {tokens} forced tokens (process CPU ms per decoding step):")
    for m in rows:
        keys = [row_key(0, p, g) for p in range(2) for g in range(m // 2)]
        seconds: dict[str, list[float]] = {"with copies": [], "without": []}
        tokens_of: dict[str, list[tuple[int, ...]]] = {}
        for _ in range(repeats):
            for side in seconds:
                path = (
                    mock.patch.object(
                        agent_module, "decode_layout", lambda model, sequences: nullcontext()
                    )
                    if side == "without"
                    else mock.patch.object(layout, "copies_pay_off", lambda: True)
                )
                with path:
                    start = time.process_time()
                    out = agent.generate(prompts, m // 2, sampling, keys=keys)
                    seconds[side].append(time.process_time() - start)
                tokens_of[side] = [c.completion_ids for row in out for c in row]
        copied, without = (statistics.median(seconds[s]) / tokens * 1e3 for s in seconds)
        same = tokens_of["with copies"] == tokens_of["without"]
        print(
            f"  {m:3d} rows: without {without:6.1f}, with copies {copied:6.1f} "
            f"({copied / without:.2f}x); same tokens: {same}"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"threads {torch.get_num_threads()}, rows {args.rows}, tokens {args.tokens}")
    print(
        f"torch's CPU kernels: {torch.backends.cpu.get_cpu_capability()}; the library makes the "
        f"copies here: {'yes' if layout.copies_pay_off() else 'no'}"
    )
    products(args.rows, args.repeats)
    agent = LLMAgent.from_pretrained(args.model or str(smollm2_path()))
    agent.generate(["warm up"], 1, SamplingConfig(max_new_tokens=2))
    generation(agent, args.rows, args.tokens, args.repeats)


if __name__ == "__main__":
    main()
