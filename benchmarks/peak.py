"""The share of the machine's peak a round reaches: its FLOPs over its time, against a matrix
multiply timed in the same run, for generation and for the update apart.

- :func:`matmul_peak`: FLOP/s of square matrix products (bf16 on a GPU, fp32 on the CPU), the
  yardstick. Measured in the run that uses it, so threads, clocks and whatever else shares the
  machine weigh on both sides alike.
- :class:`RoundMeter`: counts the FLOPs of one round (``torch.utils.flop_counter.FlopCounterMode``:
  matrix products and attention, the work a peak figure counts; elementwise work is left out, as
  in model-FLOPs-utilisation figures) and times other rounds of the same shape, since counting
  slows every op. Generation is told apart by the calls that generate: each ``(class, method)``
  of ``generate_targets`` is wrapped (its outermost call only), so the FLOPs and seconds inside
  those calls are generation's. The update's FLOPs are the rest of the round's (the rewards and
  the bookkeeping do no matrix work); its seconds run from the end of each generation call to
  the end of the last optimizer step before the next one (``torch.optim``'s global step hook), so
  logging and plotting after a step are in neither phase, only in the round's total.

Rounds and the peak are timed on one clock: wall time by default (a GPU to itself), or process
CPU seconds on a CPU shared with other work (``floor.py`` and ``vs_comlrl.py``). Used by
``scripts/gpu_check.py``, ``benchmarks/floor.py`` and ``benchmarks/vs_comlrl.py``. On
the CPU, attention through ``scaled_dot_product_attention`` is not counted (torch registers no
FLOP formula for its CPU kernel), so the CPU figures are of the matrix products alone. oneDNN's
linear on a packed weight (the decoding steps' products where ``decode_layout`` packs weights)
has none either, so the counter is given one (:func:`_packed_linear_flops`).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.flop_counter import FlopCounterMode

__all__ = [
    "PhaseTotals",
    "RoundMeter",
    "calls_of",
    "format_shares",
    "matmul_peak",
    "peak_dtype",
    "synchronize",
]

Target = tuple[type, str]
"""A method whose calls are generation: ``(LLMAgent, "generate_rows")``, ``(GenerationMixin,
"generate")``."""


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op on the CPU, whose ops are synchronous)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_dtype(device: torch.device | str) -> torch.dtype:
    """The dtype whose matrix-multiply peak is the yardstick: bf16 on a GPU, fp32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def matmul_peak(
    device: torch.device | str,
    dtype: torch.dtype | None = None,
    *,
    size: int | None = None,
    repeats: int = 10,
    trials: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """FLOP/s of ``size x size`` matrix products in ``dtype``: the best of ``trials`` runs of
    ``repeats`` back-to-back products, after warm-up ones (the figure a GPU sheet quotes is the
    same: dense products, no data-dependent work). ``size`` defaults to 8192 on a GPU and 1024
    on the CPU (2 GFLOP a product, tens of milliseconds on one core). ``clock``: as the rounds
    it is compared with are timed (:attr:`RoundMeter.clock`)."""
    device = torch.device(device)
    dtype = dtype or peak_dtype(device)
    size = size or (8192 if device.type == "cuda" else 1024)
    if size < 1 or repeats < 1 or trials < 1:
        raise ValueError(
            f"size={size}, repeats={repeats}, trials={trials}: each must be at least 1"
        )
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    out = torch.empty(size, size, device=device, dtype=dtype)
    for _ in range(3):
        torch.mm(a, b, out=out)
    best = float("inf")
    for _ in range(trials):
        synchronize(device)
        start = clock()
        for _ in range(repeats):
            torch.mm(a, b, out=out)
        synchronize(device)
        best = min(best, clock() - start)
    return 2.0 * size**3 * repeats / best


def _packed_linear_flops(x_shape: Sequence[int], w_shape: Sequence[int], *_: Any, **__: Any) -> int:
    """FLOPs of oneDNN's linear on a weight packed for it (``[out, in]``): 2 x rows x in x out,
    as ``nn.Linear``'s product counts."""
    return 2 * math.prod(x_shape[:-1]) * x_shape[-1] * w_shape[0]


@contextlib.contextmanager
def calls_of(
    targets: Sequence[Target], enter: Callable[[], None], leave: Callable[[], None]
) -> Iterator[list[int]]:
    """Wrap each ``(class, method)`` so that ``enter()`` runs before and ``leave()`` after its
    outermost call (a peft model's ``generate`` calls its base model's: counted once). Yields a
    one-item list holding the number of outermost calls seen; the methods are restored on exit."""
    depth, calls = [0], [0]
    saved = []
    for cls, name in targets:
        original = getattr(cls, name, None)
        if original is None:
            raise AttributeError(
                f"{cls.__name__} has no method {name!r}, which generation was measured through; "
                "name the method that generates now in generate_targets"
            )
        saved.append((cls, name, cls.__dict__.get(name)))
        setattr(cls, name, _wrapped(original, depth, calls, enter, leave))
    try:
        yield calls
    finally:
        for cls, name, own in reversed(saved):
            if own is None:
                delattr(cls, name)  # it was inherited: the subclass gets it back from its base
            else:
                setattr(cls, name, own)


def _wrapped(
    method: Callable[..., Any],
    depth: list[int],
    calls: list[int],
    enter: Callable[[], None],
    leave: Callable[[], None],
) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        outermost = depth[0] == 0
        if outermost:
            calls[0] += 1
            enter()
        depth[0] += 1
        try:
            return method(*args, **kwargs)
        finally:
            depth[0] -= 1
            if outermost:
                leave()

    return wrapper


@dataclass
class PhaseTotals:
    """FLOPs or seconds of one round: the whole round, the part inside generation calls and,
    for seconds, the update: each span from the end of a generation call to the end of the last
    optimizer step before the next generation (the logging and plotting after a step are in
    neither phase)."""

    total: float = 0.0
    generation: float = 0.0
    generate_calls: int = 0
    update_span: float | None = None

    @property
    def update(self) -> float:
        """Scoring, backward and optimizer steps (and the rewards, which do no matrix work):
        the measured spans, or for FLOPs (and a round without optimizer steps) all but
        generation."""
        return self.total - self.generation if self.update_span is None else self.update_span


class _Spans:
    """The clock readings of :meth:`RoundMeter.time`: generation calls and, after each, the
    span to the last optimizer step before the next call (or the round's end)."""

    def __init__(self, device: torch.device | str, clock: Callable[[], float]) -> None:
        self.device, self.clock = device, clock
        self.totals = PhaseTotals()
        self.began = self.generation_end = self.now()
        self.call_start = 0.0
        self.step_end: float | None = None

    def now(self) -> float:
        synchronize(self.device)
        return self.clock()

    def close_update(self) -> None:
        if self.step_end is not None and self.step_end > self.generation_end:
            self.totals.update_span = (self.totals.update_span or 0.0) + (
                self.step_end - self.generation_end
            )
        self.step_end = None

    def enter(self) -> None:
        self.call_start = self.now()
        self.close_update()

    def leave(self) -> None:
        self.generation_end = self.now()
        self.totals.generation += self.generation_end - self.call_start

    def step(self, *_: object) -> None:
        self.step_end = self.now()


@dataclass
class RoundMeter:
    """FLOPs of a round (:meth:`count`) and the time of the fastest of other rounds of the same
    shape (:meth:`time`), generation apart; :meth:`figures` divides them against a peak."""

    device: torch.device | str
    generate_targets: Sequence[Target]
    flops: PhaseTotals | None = None
    seconds: list[PhaseTotals] = field(default_factory=list)
    clock: Callable[[], float] = time.perf_counter
    """Wall time by default; ``time.process_time`` (CPU seconds of this process, all its threads)
    on a CPU shared with other work, with :func:`matmul_peak` on the same clock."""

    def count(self, round_fn: Callable[[], object]) -> object:
        """Run ``round_fn`` once under a FLOP counter (slow: do not time this round)."""
        totals = PhaseTotals()
        formulas = {torch.ops.mkldnn._linear_pointwise: _packed_linear_flops}
        with FlopCounterMode(display=False, custom_mapping=formulas) as counter:
            start = [0]

            def enter() -> None:
                start[0] = counter.get_total_flops()

            def leave() -> None:
                totals.generation += counter.get_total_flops() - start[0]

            with calls_of(self.generate_targets, enter, leave) as calls:
                result = round_fn()
            totals.total = float(counter.get_total_flops())
        totals.generate_calls = calls[0]
        self.flops = totals
        return result

    def time(self, round_fn: Callable[[], object]) -> object:
        """Run and time ``round_fn``; the device is waited for at the round's ends, around each
        generation call and after each optimizer step (noise against a round's seconds)."""
        spans = _Spans(self.device, self.clock)
        hook = register_optimizer_step_post_hook(spans.step)
        try:
            with calls_of(self.generate_targets, spans.enter, spans.leave) as calls:
                result = round_fn()
        finally:
            hook.remove()
        spans.close_update()
        spans.totals.total = spans.now() - spans.began
        spans.totals.generate_calls = calls[0]
        self.seconds.append(spans.totals)
        return result

    def best(self) -> PhaseTotals:
        """The fastest timed round (the others paid one-time costs or shared the machine)."""
        if not self.seconds:
            raise ValueError("no round was timed; call time(round_fn) first")
        return min(self.seconds, key=lambda t: t.total)

    def figures(self, peak: float) -> dict[str, dict[str, float]]:
        """Per phase (generation, update, round): FLOPs, seconds, FLOP/s and the share of
        ``peak`` (FLOP/s of :func:`matmul_peak` from the same run)."""
        if self.flops is None:
            raise ValueError("no round was counted; call count(round_fn) first")
        if not peak > 0:
            raise ValueError(f"peak={peak!r} must be a positive FLOP/s figure")
        best = self.best()
        if self.flops.generate_calls == 0 or best.generate_calls == 0:
            raise RuntimeError(
                f"no call of {[f'{c.__name__}.{n}' for c, n in self.generate_targets]} was seen "
                "in a round, so generation cannot be told apart; name the method that generates "
                "now in generate_targets"
            )
        out = {}
        for phase in ("generation", "update", "total"):
            flops, seconds = getattr(self.flops, phase), getattr(best, phase)
            rate = flops / seconds if seconds > 0 else float("nan")
            out["round" if phase == "total" else phase] = {
                "flops": flops,
                "seconds": seconds,
                "flop_per_s": rate,
                "share_of_peak": rate / peak,
            }
        return out


def format_shares(figures: dict[str, dict[str, float]], per: str = "s") -> str:
    """``generation 1.2% (3.4 GFLOP/s), update 8.9% (...)``: one line of
    :meth:`RoundMeter.figures` (``per="CPU s"`` for rounds timed in CPU seconds)."""
    return ", ".join(
        f"{phase} {f['share_of_peak']:.1%} ({f['flop_per_s'] / 1e9:.1f} GFLOP/{per})"
        for phase, f in figures.items()
    )
