"""The runs of an experiment: one ``cmlrl`` run file per (task, method, seed) at equal compute,
and running one of them with its compute counted and its evaluations recorded.

Equal compute, as the runner enforces it (``run_files``): every method of a task trains for the
same rounds (``epochs × train_items / items_per_round``), each round one optimizer step per
model on ``items_per_round`` items, and samples ``num_generations`` (G) completions per model
per item and turn. The team's two agents get ``max_new_tokens`` tokens each; a method in which
one model writes both roles (single-agent GRPO, centralized MAGRPO) gets ``2 × max_new_tokens``
per completion. So the generation budget of a 1-turn round is ``items × G × 2 × max_new_tokens``
tokens for every method, and every method takes the same optimizer steps. The tokens actually
generated (completions end at EOS) are counted and reported beside the budget.

Only the trainers' public surface is used: the ``cmlrl`` run file (``plan``, ``build_trainer``),
``trainer.train()``, ``trainer.evaluate()``, ``trainer.items_seen``, the ``eval_logger`` /
``eval_aggregator`` hooks and the ``GenerationBackend`` protocol (a counting wrapper).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cmlrl_agents.cli.experiment_eval import Clock, CountingBackend, EvalRecorder, repeated
from cmlrl_agents.cli.spec import CLIError

__all__ = ["PARSE_FAILURE_REWARD", "Progress", "Run", "check_runs", "run_files", "run_one"]

PARSE_FAILURE_REWARD = 0.0
"""The centralized baseline's reward for a completion that does not parse: the minimum of the
code and writing rewards, i.e. what an empty answer gets; no penalty below it."""
DEFAULT_DATASETS = {
    "code": "cmlrl_env.code_tasks:humaneval_small_splits",
    "writing": "cmlrl_env.writing_tasks:writing_news_splits",
}
_WRITING_HOOKS = {
    "eval_logger": "cmlrl_env.writing_tasks:writing_eval_logger",
    "eval_aggregator": "cmlrl_env.writing_tasks:writing_eval_aggregator",
}
ROLES = 2


@dataclass
class Run:
    """One (task, method, seed) of an experiment: its run file and its folder."""

    task: str
    method: str
    seed: int
    spec: dict[str, Any]
    folder: Path
    rounds: int
    settings: dict[str, Any] = field(default_factory=dict)
    """The task's merged settings (compute, eval, num_turns, ...)."""

    @property
    def name(self) -> str:
        return f"{self.task}/{self.method}/seed-{self.seed}"

    @property
    def result_path(self) -> Path:
        return self.folder / "result.json"

    @property
    def settings_record(self) -> dict[str, Any]:
        """What a run computes: its run file and the evaluation protocol around it."""
        return {"run": self.spec, "eval": self.settings.get("eval", {})}

    @property
    def key(self) -> str:
        """The sha256 of ``settings_record`` without the run's folder: a finished run is reused
        only under this key."""
        return hashlib.sha256(_comparable(self.settings_record).encode("utf-8")).hexdigest()

    def finished(self) -> bool:
        """Whether the run finished before with these settings; refuses (``CLIError``, naming
        the first field that differs) a finished run whose settings differ. The run's folder
        is not a setting: the same results read from a copy, or by another spelling of the
        path, are the same runs."""
        if not self.result_path.is_file():
            return False
        stored = self.result()
        if _comparable(stored.get("settings", {})) == _comparable(self.settings_record):
            return True
        field = _first_difference(stored.get("settings", {}), self.settings_record)
        raise CLIError(
            f"{self.name} finished before with other settings ({field}); its results in "
            f"{self.folder} were not made by this experiment. Give another output_dir, or "
            "delete that folder to run it again."
        )

    def result(self) -> dict[str, Any]:
        return json.loads(self.result_path.read_text(encoding="utf-8"))


def _comparable(record: Mapping[str, Any]) -> str:
    """A settings record as sorted JSON, its run folder (``run.config.output_dir``) left out."""
    run = dict(record.get("run", {}))
    run["config"] = {k: v for k, v in dict(run.get("config", {})).items() if k != "output_dir"}
    return json.dumps({**record, "run": run}, sort_keys=True, default=str)


def _first_difference(old: Any, new: Any, path: str = "") -> str:
    """The first dotted field where two settings records differ, with both values."""
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new), key=str):
            if old.get(key, "<unset>") != new.get(key, "<unset>"):
                where = f"{path}.{key}" if path else str(key)
                return _first_difference(old.get(key, "<unset>"), new.get(key, "<unset>"), where)
        return "no field"
    return f"{path or 'settings'}: {old!r} then, {new!r} now"


def provenance() -> dict[str, Any]:
    """The library's commit (``None`` outside a git checkout) and whether its files differed."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            command = ["git", "-C", str(root), *args]
            done = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--", "cmlrl_env", "cmlrl_agents")
    return {"commit": commit, "uncommitted_changes": bool(changed) if commit else None}


def _task_section(task: dict[str, Any], method: str) -> dict[str, Any]:
    dataset = task["dataset"] or DEFAULT_DATASETS[task["kind"]]
    section: dict[str, Any] = {
        "dataset": dataset,
        "max_train_items": task["compute"]["train_items"],
    }
    if task["dataset_kwargs"] is not None:
        section["dataset_kwargs"] = task["dataset_kwargs"]
    if task["kind"] == "code":
        section["name"] = "humaneval_single" if method == "single" else "humaneval"
        if task["num_turns"] == 1:
            section["transition"] = None
        return section
    section.update(_WRITING_HOOKS)
    if method == "single":
        section["formatters"] = ["cmlrl_env.writing_tasks:single_writing_formatter"]
        section["reward"] = "cmlrl_env.writing_tasks:writing_single_reward"
    else:
        section["name"] = "writing"
    return section


def _config(task: dict[str, Any], method: str, seed: int, folder: Path) -> dict[str, Any]:
    compute, evaluation = task["compute"], task["eval"]
    per_completion = compute["max_new_tokens"] * (1 if method == "team" else ROLES)
    config = {
        **task["config"],
        "num_generations": compute["num_generations"],
        "max_new_tokens": per_completion,
        "rollout_buffer_size": compute["items_per_round"],
        "train_batch_size": None,
        "num_train_epochs": compute["epochs"],
        "num_turns": task["num_turns"],
        "eval_interval": evaluation["every_rounds"] * compute["items_per_round"],
        "eval_batch_size": evaluation["batch_size"],
        "seed": seed,
        "output_dir": str(folder),
        "overwrite_output_dir": True,
        "save_steps": 0,
        "verbose": False,
    }
    if method == "centralized":
        config["parse_failure_reward"] = PARSE_FAILURE_REWARD
    else:
        config["num_agents"] = ROLES if method == "team" else 1
    return config


def run_files(plan: Any) -> list[Run]:
    """Every (task, method, seed) of ``plan`` as a ``Run``, tasks in file order."""
    runs = []
    for name, task in plan.tasks.items():
        compute = task["compute"]
        if compute["num_generations"] < 2:
            raise CLIError(f"task {name}: compute.num_generations must be >= 2 (a group).")
        rounds = compute["epochs"] * compute["train_items"] // compute["items_per_round"]
        for method in task["methods"]:
            for seed in task["seeds"]:
                folder = plan.output_dir / name / method / f"seed-{seed}"
                spec = {
                    "algorithm": "magrpo_centralized" if method == "centralized" else "magrpo",
                    "model": plan.model,
                    "task": _task_section(task, method),
                    "config": _config(task, method, seed, folder),
                }
                runs.append(Run(name, method, seed, spec, folder, rounds, task))
    return runs


def run_one(
    run: Run, progress: Progress, *, train: bool = True, final_eval: bool = True
) -> dict[str, Any]:
    """Train and evaluate one run from its beginning (an interrupted run's folder is cleared);
    write and return ``result.json``. The pilot's runs skip the evaluation after training
    (``final_eval=False``) or training itself (``train=False``: the untrained evaluation)."""
    from cmlrl_agents.cli.plan import build_trainer, plan
    from cmlrl_agents.runs.threads import apply_num_threads

    library = provenance()  # at the start: the code the run ran on
    if run.folder.exists():
        shutil.rmtree(run.folder)
    run.folder.mkdir(parents=True)
    (run.folder / "run.yaml").write_text(yaml.safe_dump(run.spec, sort_keys=False), "utf-8")
    p = plan(run.spec, source=str(run.folder / "run.yaml"))
    evaluation, compute = run.settings["eval"], run.settings["compute"]
    _check_train_size(run, p.task.spec_keywords["dataset"])
    p.task.eval_dataset = repeated(
        p.task.eval_dataset, evaluation.get("max_items"), evaluation["samples_per_item"]
    )
    p.config.eval_num_samples = len(p.task.eval_dataset)
    recorder = EvalRecorder(
        p.task.callbacks,
        num_turns=run.settings["num_turns"],
        centralized=run.method == "centralized",
        parse_failure_reward=PARSE_FAILURE_REWARD,
        pass_k=evaluation["pass_k"],
        path=run.folder / "evals.jsonl",
    )
    p.task.callbacks = recorder.hooks()
    trainer = build_trainer(p, use_wandb=False)
    counter = _count_generation(trainer, progress)
    recorder.attach(trainer, counter, compute["items_per_round"], p.config.items_per_step)
    recorder.final = int(final_eval and train)
    apply_num_threads(p.config.num_threads)  # train() applies it: the evaluation before too
    start = time.perf_counter()
    try:
        if not evaluation["every_rounds"]:
            trainer.evaluate()  # before training; with every_rounds, train() evaluates first
        clock = Clock()
        if train:
            trainer.train()
        timing = clock.elapsed()
        if final_eval and train:
            trainer.evaluate()
    finally:
        trainer.close()
    result = recorder.result(run, timing, time.perf_counter() - start)
    result.update(key=run.key, settings=run.settings_record, library=library)
    tmp = run.result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1), encoding="utf-8")
    tmp.replace(run.result_path)  # written whole or not at all: a finished run is one with it
    return result


def _count_generation(trainer: Any, progress: Progress) -> CountingBackend:
    """Put a counting wrapper around the trainer's generation backend (training and evaluation
    read the one the trainer holds)."""
    counter = CountingBackend(
        trainer.generation_backend, on_train=progress.tick, on_eval=progress.eval_tick
    )
    trainer.generation_backend = counter
    return counter


def check_runs(runs: Sequence[Run]) -> None:
    """Every run's run file and training set, before the first run trains: a mistake in the
    last task's settings stops the command now, not hours in."""
    from cmlrl_agents.cli.plan import plan

    for run in runs:
        try:
            planned = plan(run.spec, need_model=False, source=f"the run file of {run.name}")
        except (ValueError, TypeError) as exc:
            raise CLIError(f"{run.name}: {exc}") from exc
        _check_train_size(run, planned.task.spec_keywords["dataset"])


def _check_train_size(run: Run, train: Any) -> None:
    wanted = run.settings["compute"]["train_items"]
    if hasattr(train, "__len__") and len(train) < wanted:
        raise CLIError(
            f"task {run.task}: compute.train_items={wanted} but its train split has "
            f"{len(train)} items; lower train_items (and raise epochs) or give a larger dataset."
        )


class Progress:
    """A bar over every run's rounds in a terminal; elsewhere one line per run and a line at
    most every ``every_s`` seconds while a run trains."""

    def __init__(self, runs: list[Run], out: Any, every_s: float = 60.0) -> None:
        from tqdm import tqdm

        self.out, self.every_s = out, every_s
        self.count, self.index = len(runs), 0
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        total = sum(r.rounds for r in runs)
        self.bar = tqdm(total=total, unit="round", file=out, disable=not self.tty)
        self.run: Run | None = None
        self.base, self.done_rounds, self.last_line = 0, 0, 0.0

    def _line(self, text: str) -> None:
        if self.tty:
            self.bar.write(text)
        else:
            print(text, file=self.out, flush=True)

    def start(self, run: Run) -> None:
        self.index += 1
        self.run, self.done_rounds = run, 0
        self.bar.set_description(run.name)
        self.last_line = time.monotonic()

    def skip(self, run: Run) -> None:
        self.bar.update(run.rounds)
        self._line(f"[{self.index}/{self.count}] {run.name}: finished before, skipped")

    def _now_and_then(self, text: str) -> None:
        """``text`` about the current run, at most one line every ``every_s`` seconds."""
        if time.monotonic() - self.last_line >= self.every_s and self.run:
            self.last_line = time.monotonic()
            self._line(f"[{self.index}/{self.count}] {self.run.name}: {text}")

    def tick(self, rounds_done: int) -> None:
        """A training round started after ``rounds_done`` finished rounds of the current run."""
        if rounds_done > self.done_rounds:
            self.bar.update(rounds_done - self.done_rounds)
            self.done_rounds = rounds_done
        if not self.tty and self.run:  # in a terminal the bar shows the rounds
            self._now_and_then(f"round {rounds_done + 1}/{self.run.rounds}")

    def eval_tick(self, requests: int) -> None:
        """An evaluation pass of the current run has answered ``requests`` generation requests
        (one per agent, item and turn): a line at most every ``every_s`` seconds."""
        self._now_and_then(f"evaluating, {requests} generation requests answered")

    def done(self, run: Run, result: dict[str, Any]) -> None:
        self.bar.update(run.rounds - self.done_rounds)
        before, after = result["points"][0], result["points"][-1]
        self._line(
            f"[{self.index}/{self.count}] {run.name}: eval reward {before['reward']:.3f} -> "
            f"{after['reward']:.3f} ({after['samples']} samples), {result['wall_s']:.0f} s"
        )

    def close(self) -> None:
        self.bar.close()
