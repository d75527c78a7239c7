"""What an experiment run measures: generated tokens (a counting ``GenerationBackend``) and
each evaluation's per-sample rewards (wrapped ``eval_logger`` / ``eval_aggregator`` hooks),
summarised per eval point with standard errors, pass@k and the parse rate.

The standard error of an eval point's mean reward is that of the fixed eval set: with ``k``
samples per item, ``sqrt(sum_i s_i^2 / k) / n`` over its ``n`` items (``s_i^2``: item ``i``'s
sample variance), which measures the sampling noise of the answers, not the choice of items;
with one sample per item it is ``std / sqrt(n)``.
"""

from __future__ import annotations

import hashlib
import json
import math
import resource
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset

from cmlrl_env.code_metrics import pass_at_k

__all__ = ["Clock", "CountingBackend", "EvalRecorder", "mean_se", "repeated", "summarize"]


class Clock:
    """Wall seconds and CPU seconds (this process and its finished children, e.g. the code
    reward's sandboxed programs) since it was made."""

    def __init__(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), self.cpu()

    @staticmethod
    def cpu() -> float:
        own, children = (
            resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    def elapsed(self) -> tuple[float, float]:
        """(wall, cpu) seconds since the clock was made."""
        return time.perf_counter() - self.wall0, self.cpu() - self.cpu0


def repeated(data: Any, max_items: int | None, times: int) -> Dataset:
    """The first ``max_items`` items of ``data`` (all when None), each ``times`` times in a
    row: ``times`` answers per item in one evaluation."""
    if not isinstance(data, Dataset):
        raise TypeError(
            f"the experiment evaluates a map-style datasets.Dataset, got {type(data).__name__}; "
            "give the task a dataset with an eval split."
        )
    n = len(data) if max_items is None else min(max_items, len(data))
    return data.select([i for i in range(n) for _ in range(times)])


class CountingBackend:
    """A ``GenerationBackend`` that passes every call to ``inner`` and counts the completion
    tokens. Training requests sample a group (``num_samples > 1``); evaluation samples one."""

    def __init__(
        self,
        inner: Any,
        on_train: Callable[[int], None] | None = None,
        on_eval: Callable[[int], None] | None = None,
    ) -> None:
        self.inner, self.on_train, self.on_eval = inner, on_train, on_eval
        self.train_tokens = self.eval_tokens = 0
        self.eval_requests = 0  # answered in the current evaluation pass
        self.eval_started: Clock | None = None
        self.rounds_done: Callable[[], int] = lambda: 0

    def generate(self, agents: Sequence[Any], requests: Sequence[Any]) -> list[Any]:
        training = any(r.num_samples > 1 for r in requests)
        if training and self.on_train is not None:
            self.on_train(self.rounds_done())
        if not training and self.eval_started is None:
            self.eval_started, self.eval_requests = Clock(), 0
        out = self.inner.generate(agents, requests)
        if not training:
            self.eval_requests += len(requests)
            if self.on_eval is not None:
                self.on_eval(self.eval_requests)
        tokens = sum(len(c.completion_ids) for request in out for row in request for c in row)
        if training:
            self.train_tokens += tokens
        else:
            self.eval_tokens += tokens
        return out

    def sync(self, agents: Sequence[Any]) -> None:
        self.inner.sync(agents)


def _key(item: Mapping[str, Any]) -> str:
    if "task_id" in item:
        return str(item["task_id"])
    text = str(item.get("prompt", item))
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]


def _se(groups: Mapping[str, list[float]]) -> float:
    values = [v for vs in groups.values() for v in vs]
    k = min(len(vs) for vs in groups.values())
    if len(values) < 2:
        return math.nan
    if k < 2:
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
        return std / math.sqrt(len(values))
    within = 0.0
    for vs in groups.values():
        m = sum(vs) / len(vs)
        within += sum((v - m) ** 2 for v in vs) / (len(vs) - 1) / len(vs)
    return math.sqrt(within) / len(groups)


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (sample std / sqrt(n); NaN for fewer than 2 values)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return math.nan
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def summarize(samples: list[dict[str, Any]], num_turns: int, pass_k: int) -> dict[str, Any]:
    """One eval point from its samples (``item``, ``reward`` and, for code, ``passed`` per
    turn, ``parsed`` for the centralized baseline, ``row``: the eval logger's values): per-turn
    means, std and standard error, pass@1 and pass@k, the parse rate, the mean of each level
    and content measure; ``reward`` is the last turn's mean."""
    out: dict[str, Any] = {"samples": len(samples)}
    for turn in range(1, num_turns + 1):
        key = f"turn_{turn}"
        groups: dict[str, list[float]] = defaultdict(list)
        passes: dict[str, list[float]] = defaultdict(list)
        for s in samples:
            groups[s["item"]].append(s["reward"][key])
            if "passed" in s:
                passes[s["item"]].append(s["passed"][key])
        values = [v for vs in groups.values() for v in vs]
        out[f"{key}/reward"] = sum(values) / len(values)
        out[f"{key}/reward_std"] = _std(values)
        out[f"{key}/reward_se"] = _se(groups)
        if passes:
            n_c = [(len(v), int(sum(v))) for v in passes.values()]
            out[f"{key}/pass@1"] = sum(pass_at_k(n, c, 1) for n, c in n_c) / len(n_c)
            out[f"{key}/pass@{pass_k}"] = sum(pass_at_k(n, c, pass_k) for n, c in n_c) / len(n_c)
    measures: dict[str, list[float]] = defaultdict(list)
    for s in samples:  # the levels and the measures the reward does not train on
        for name, value in s.get("row", {}).items():
            if "/level/" in name or "/content/" in name:
                measures[name].append(value)
    out.update({name: sum(vs) / len(vs) for name, vs in measures.items()})
    last = f"turn_{num_turns}"
    out["reward"], out["reward_se"] = out[f"{last}/reward"], out[f"{last}/reward_se"]
    if any("parsed" in s for s in samples):
        out["parse_rate"] = sum(s["parsed"] for s in samples) / len(samples)
    return out


class EvalRecorder:
    """Wraps a run's ``eval_logger`` / ``eval_aggregator``: each evaluation's samples become
    one point (``summarize``) with the training compute spent before it, appended to
    ``path`` (JSON lines) as it happens."""

    def __init__(
        self,
        callbacks: Mapping[str, Callable[..., Any]],
        *,
        num_turns: int,
        centralized: bool,
        parse_failure_reward: float,
        pass_k: int,
        path: Path,
    ) -> None:
        missing = [k for k in ("eval_logger", "eval_aggregator") if k not in callbacks]
        if missing:
            raise ValueError(f"the experiment's task needs {missing} to record its evaluations.")
        self.callbacks = dict(callbacks)
        self.num_turns, self.centralized = num_turns, centralized
        self.parse_failure_reward, self.pass_k, self.path = parse_failure_reward, pass_k, path
        self.points: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []
        self.trainer: Any = None
        self.counter: CountingBackend | None = None
        self.items_per_round = self.items_per_step = 1
        self.final = 1  # the evaluation after train(): 0 when the run skips it

    def hooks(self) -> dict[str, Callable[..., Any]]:
        """The task's callbacks with the two eval hooks replaced by the recording ones."""
        return {**self.callbacks, "eval_logger": self.logger, "eval_aggregator": self.aggregator}

    def attach(
        self, trainer: Any, counter: CountingBackend, items_per_round: int, items_per_step: int
    ) -> None:
        self.trainer, self.counter = trainer, counter
        self.items_per_round, self.items_per_step = items_per_round, items_per_step
        counter.rounds_done = lambda: trainer.items_seen // items_per_round

    def logger(
        self,
        *,
        agent_completions_turns: Sequence[Sequence[Sequence[str]]],
        batch_items: Sequence[Mapping[str, Any]],
        prompts: Sequence[Any] | None = None,
    ) -> list[dict[str, float]]:
        rows = self.callbacks["eval_logger"](
            agent_completions_turns=agent_completions_turns,
            batch_items=batch_items,
            prompts=prompts,
        )
        for i, (row, item) in enumerate(zip(rows, batch_items, strict=True)):
            self.pending.append(self._sample(row, item, [a[i] for a in agent_completions_turns]))
        return rows

    def _sample(
        self, row: Mapping[str, float], item: Mapping[str, Any], chains: list[Sequence[str]]
    ) -> dict[str, Any]:
        turns = [f"turn_{t}" for t in range(1, self.num_turns + 1)]
        sample: dict[str, Any] = {"item": _key(item)}
        # An unparsed centralized completion reaches the logger as "" for every role.
        parsed = not (self.centralized and all(c[0] == "" for c in chains))
        sample["reward"] = {
            t: row[f"{t}/reward"] if parsed else self.parse_failure_reward for t in turns
        }
        if f"{turns[0]}/passed" in row:
            sample["passed"] = {t: row[f"{t}/passed"] for t in turns}
        if self.centralized:
            sample["parsed"] = parsed
        sample["row"] = {k: v for k, v in row.items() if isinstance(v, (int, float))}
        sample["completions"] = [list(chain) for chain in chains]  # to read for reward hacking
        return sample

    def aggregator(self, rows: Sequence[Mapping[str, float]], *, num_turns: int) -> Any:
        out = self.callbacks["eval_aggregator"](rows, num_turns=num_turns)
        self._close_point()
        return out

    def _close_point(self) -> None:
        assert self.counter is not None and self.trainer is not None, "attach() first"
        point = summarize(self.pending, self.num_turns, self.pass_k)
        rounds = self.trainer.items_seen // self.items_per_round
        steps_per_round = -(-self.items_per_round // self.items_per_step)
        wall, cpu = (self.counter.eval_started or Clock()).elapsed()
        point.update(
            rounds=rounds,
            optimizer_steps=rounds * steps_per_round,
            train_tokens=self.counter.train_tokens,
            eval_s=wall,
            eval_cpu_s=cpu,
        )
        self.counter.eval_started = None
        self.points.append(point)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(point) + "\n")
        with self.path.with_name("eval-samples.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps({"rounds": rounds, "samples": self.pending}) + "\n")
        self.pending = []

    def result(self, run: Any, train: tuple[float, float], wall: float) -> dict[str, Any]:
        """The run's ``result.json``: its points, compute and timings (``train``: the wall
        and CPU seconds of ``train()``, its evaluations included, which are taken out)."""
        assert self.counter is not None
        # With every_rounds, train() made the first evaluation too, before its first round.
        first = 0 if run.settings["eval"]["every_rounds"] else 1
        inside = self.points[first : len(self.points) - self.final]
        train_wall = train[0] - sum(p["eval_s"] for p in inside)
        train_cpu = train[1] - sum(p["eval_cpu_s"] for p in inside)
        rounds = self.trainer.items_seen // self.items_per_round
        steps = rounds * -(-self.items_per_round // self.items_per_step)
        compute = run.settings["compute"]
        budget = compute["items_per_round"] * compute["num_generations"] * ROLES_BUDGET
        return {
            "task": run.task,
            "method": run.method,
            "seed": run.seed,
            "num_turns": self.num_turns,
            "points": self.points,
            "rounds": rounds,
            "optimizer_steps": steps,
            "train_tokens": self.counter.train_tokens,
            "train_tokens_per_round": self.counter.train_tokens / max(rounds, 1),
            "token_budget_per_round_turn_1": budget * compute["max_new_tokens"],
            "s_per_round": train_wall / max(rounds, 1),
            "cpu_s_per_round": train_cpu / max(rounds, 1),
            "eval_s_per_pass": sum(p["eval_s"] for p in self.points) / len(self.points),
            "eval_cpu_s_per_pass": sum(p["eval_cpu_s"] for p in self.points) / len(self.points),
            "eval_tokens_per_pass": self.counter.eval_tokens / len(self.points),
            "wall_s": wall,
        }


ROLES_BUDGET = 2
"""Roles written per item and turn: the team's two agents, or one model writing both."""
