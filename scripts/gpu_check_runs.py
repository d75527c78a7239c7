"""The training runs of ``gpu_check.py``: a short MAGRPO run of one team, measured.

Each team trains through the public API only (``MAGRPOTrainer``, ``MAGRPOConfig``,
``peft_config=``, ``trainer.train()``, ``trainer.agents``, ``agent.trainable_parameters()``), one
round per ``train()`` call (one epoch over ``rollout_buffer_size`` items, the epochs raised by one
before each call, as ``benchmarks/floor.py`` does). The first round is counted (FLOPs, and it pays
the one-time costs), the next ones are timed, and on CUDA a last one counts the host syncs.
"""

from __future__ import annotations

import gc
import math
import resource
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from gpu_check_models import Size, build_model, lora_config, task
from peak import RoundMeter, calls_of
from torch.optim.optimizer import register_optimizer_step_post_hook

from cmlrl_agents import LLMAgent, MAGRPOConfig, MAGRPOTrainer

GENERATE_TARGETS = [(LLMAgent, "generate_rows")]
"""Every generation of the "hf" backend goes through this public agent method."""


@dataclass(frozen=True)
class Team:
    """One team to train: ``adapters`` agents on one base, or full models of their own."""

    name: str
    agents: int
    adapters: bool


TEAMS = (Team("adapters_2", 2, True), Team("adapters_4", 4, True), Team("full_2", 2, False))


def build_trainer(
    team: Team, size: Size, tokenizer: Any, device: str, dtype: torch.dtype, out: str
) -> MAGRPOTrainer:
    """The team's trainer; adapters share one base in ``dtype`` (their weights are float32),
    full models are loaded in ``dtype`` and kept in float32 by the library (master weights)."""
    vocab = len(tokenizer)
    if team.adapters:
        base = build_model(size, vocab, dtype, device, seed=0)
        models = [base] * team.agents  # one object: one base held once
    else:
        models = [build_model(size, vocab, dtype, device, seed=i) for i in range(team.agents)]
    config = MAGRPOConfig(
        num_agents=team.agents,
        num_generations=size.generations,
        max_new_tokens=size.tokens,
        min_new_tokens=size.tokens,  # every completion is exactly `tokens` long: fixed work
        rollout_buffer_size=size.items,
        num_train_epochs=1,
        eval_interval=0,
        logging_steps=1,
        agent_learning_rate=1e-4 if team.adapters else 5e-5,
        agent_devices=device,
        seed=0,
        verbose=False,
        output_dir=out,
    )
    return MAGRPOTrainer(
        agents=models,
        tokenizer=tokenizer,
        peft_config=lora_config() if team.adapters else None,
        args=config,
        **task(team.agents, size.items),
    )


def weight_dtypes(trainer: MAGRPOTrainer) -> dict[str, list[str]]:
    """The dtypes of the weights the agents train and of the rest (a shared base)."""
    trained = {id(p): p for a in trainer.agents for p in a.trainable_parameters()}
    models = {id(a.model): a.model for a in trainer.agents}.values()
    frozen = [p for m in models for p in m.parameters() if id(p) not in trained]
    return {
        "trained": sorted({str(p.dtype).removeprefix("torch.") for p in trained.values()}),
        "frozen": sorted({str(p.dtype).removeprefix("torch.") for p in frozen}),
    }


def one_round(trainer: MAGRPOTrainer, metrics: list[dict[str, float]]) -> Callable[[], None]:
    def run() -> None:
        if trainer.epoch >= trainer.args.num_train_epochs:
            trainer.args.num_train_epochs += 1  # one more epoch of the round's items
        metrics.append(trainer.train())

    return run


def snapshot(trainer: MAGRPOTrainer) -> list[list[torch.Tensor]]:
    """The trainable weights, copied to the host (a copy on the device would count in the
    team's peak memory)."""
    return [
        [p.detach().to("cpu", copy=True) for p in a.trainable_parameters()] for a in trainer.agents
    ]


def moved(before: list[list[torch.Tensor]], trainer: MAGRPOTrainer) -> list[dict[str, float]]:
    """Per agent: the share of its trainable tensors that changed and the largest change."""
    out = []
    for old, agent in zip(before, trainer.agents, strict=True):
        new = [p.detach().cpu() for p in agent.trainable_parameters()]
        diffs = [float((a - b).abs().max()) for a, b in zip(old, new, strict=True)]
        out.append(
            {
                "tensors": len(diffs),
                "share_changed": sum(d > 0 for d in diffs) / max(len(diffs), 1),
                "max_abs_change": max(diffs, default=0.0),
            }
        )
    return out


def count_host_syncs(round_fn: Callable[[], None]) -> dict[str, float]:
    """Host syncs of one round (``torch.cuda.set_sync_debug_mode("warn")``: one warning per
    synchronizing call), inside generation calls and in the rest, per optimizer step."""
    steps = [0]
    hook = register_optimizer_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    inside, start = [0], [0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def syncs(since: int = 0) -> int:
            return sum("synchroniz" in str(w.message) for w in caught[since:])

        def leave() -> None:
            inside[0] += syncs(start[0])

        torch.cuda.set_sync_debug_mode("warn")
        try:
            with calls_of(GENERATE_TARGETS, lambda: start.__setitem__(0, len(caught)), leave) as n:
                round_fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            hook.remove()
        total = syncs()
    rest = total - inside[0]
    return {
        "total": total,
        "in_generation": inside[0],
        "generate_calls": n[0],
        "outside_generation": rest,
        "optimizer_steps": steps[0],
        "per_optimizer_step": rest / steps[0] if steps[0] else float("nan"),
    }


def free_memory(device: str) -> int:
    """Release what earlier sections left and start this team's peak; the bytes still held."""
    gc.collect()
    if not device.startswith("cuda"):
        return 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def memory(device: str, agents: int, held_before: int) -> dict[str, Any]:
    if device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated(device)
        return {
            "kind": "torch.cuda.max_memory_allocated over this team's run; per agent: / agents",
            "held_before_bytes": held_before,
            "peak_bytes": peak,
            "per_agent_bytes": peak / agents,
        }
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {
        "kind": "peak RSS of the whole process so far (CPU: no per-team figure)",
        "peak_bytes": peak,
        "per_agent_bytes": peak / agents,
    }


def finite(metrics: list[dict[str, float]]) -> bool:
    return bool(metrics) and all(
        isinstance(v, (int, float)) and math.isfinite(v) for m in metrics for v in m.values()
    )


def train_team(
    team: Team, size: Size, tokenizer: Any, device: str, dtype: torch.dtype, peaks: dict
) -> dict[str, Any]:
    """Build, count, time and check one team; free its memory before returning."""
    held_before = free_memory(device)
    with tempfile.TemporaryDirectory() as out:
        trainer = build_trainer(team, size, tokenizer, device, dtype, out)
        compute = torch.float32 if not team.adapters else dtype
        before, metrics = snapshot(trainer), []
        meter = RoundMeter(device, GENERATE_TARGETS)
        run = one_round(trainer, metrics)
        meter.count(run)
        for _ in range(size.timed_rounds):
            meter.time(run)
        syncs = count_host_syncs(run) if device.startswith("cuda") else "n/a"
        result = {
            "agents": team.agents,
            "adapters": team.adapters,
            "weights_dtype": str(compute).removeprefix("torch."),
            "weight_dtypes": weight_dtypes(trainer),
            "base_dtype_expected": str(dtype).removeprefix("torch.") if team.adapters else None,
            "rounds": len(metrics),
            "parameters_moved": moved(before, trainer),
            "metrics_finite": finite(metrics),
            "last_metrics": metrics[-1],
            "host_syncs": syncs,
            "memory": memory(device, team.agents, held_before),
            **throughput(meter, team, size, peaks, compute),
        }
        trainer.close()
    del trainer, before
    free_memory(device)
    result["failures"] = team_failures(team.name, result)
    return result


def throughput(
    meter: RoundMeter, team: Team, size: Size, peaks: dict, compute: torch.dtype
) -> dict[str, Any]:
    """Tokens per second and the share of peak, generation and update apart; the peak is the
    matrix multiply's in the dtype the team computes in (and bf16's, when that differs)."""
    tokens = team.agents * size.items * size.generations * size.tokens
    name = str(compute).removeprefix("torch.")
    figures = meter.figures(peaks[name])
    for phase in ("generation", "update"):
        figures[phase]["completion_tokens_per_s"] = tokens / figures[phase]["seconds"]
        for other, peak in peaks.items():
            if other != name:
                figures[phase][f"share_of_{other}_peak"] = figures[phase]["flop_per_s"] / peak
    return {
        "completion_tokens_per_round": tokens,
        "generate_calls_per_round": meter.best().generate_calls,
        "peak_dtype": name,
        "timed_rounds_seconds": [t.total for t in meter.seconds],
        **figures,
    }


def team_failures(name: str, result: dict[str, Any]) -> list[str]:
    failures = []
    for i, agent in enumerate(result["parameters_moved"]):
        if agent["share_changed"] == 0:
            failures.append(f"{name}: agent {i}'s parameters did not move")
    dtypes = result["weight_dtypes"]
    if dtypes["trained"] != ["float32"]:
        failures.append(f"{name}: trained weights are {dtypes['trained']}, not float32")
    expected = result["base_dtype_expected"]
    if expected is not None and dtypes["frozen"] != [expected]:
        failures.append(f"{name}: the shared base is {dtypes['frozen']}, not {expected}")
    if not result["metrics_finite"]:
        failures.append(f"{name}: a metric is not finite: {result['last_metrics']}")
    return failures
