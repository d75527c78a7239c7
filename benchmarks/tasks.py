"""One short measured run per paper task on SmolLM2-135M-Instruct: before/after and wall time.

    python benchmarks/tasks.py                 # every task, the settings below (CPU, minutes)
    python benchmarks/tasks.py --only writing

Each task is its run file in examples/configs with the overrides of ``RUNS`` (fewer items and
tokens, so the whole script stays short on two CPU cores). For each it evaluates the eval items
(one sample per agent per turn), trains, evaluates again, and prints one Markdown table row:
the eval reward (and pass@1 / test pass rate for code) before and after, and the wall time of
the whole run (model load, both evaluations and training). A 135M model writing code scores low;
the table says what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUNS: dict[str, tuple[str, dict[str, object]]] = {
    "HumanEval, 2 agents (MAGRPO, 1 turn)": (
        "humaneval.yaml",
        {
            "config.num_turns": 1,
            "config.max_new_tokens": 96,
            "task.max_train_items": 2,
            "task.max_eval_items": 2,
            "config.eval_num_samples": 2,
        },
    ),
    "HumanEval, 1 model for both roles (centralized)": (
        "humaneval_centralized.yaml",
        {
            "config.max_new_tokens": 160,
            "task.max_train_items": 2,
            "task.max_eval_items": 2,
            "config.eval_num_samples": 2,
        },
    ),
    "Writing, 2 agents (MAGRPO)": (
        "writing.yaml",
        {"config.max_new_tokens": 48, "task.max_train_items": 3, "config.rollout_buffer_size": 3},
    ),
}


def headline(metrics: dict[str, float]) -> str:
    reward = metrics.get("eval/turn_1/reward_mean", float("nan"))
    parts = [f"{reward:.2f}"]
    if "eval/turn_1/pass@1" in metrics:
        parts.append(f"pass@1 {metrics['eval/turn_1/pass@1']:.2f}")
        parts.append(f"tests {metrics['eval/turn_1/test_pass_rate']:.2f}")
    if "eval/parse_rate" in metrics:
        parts.append(f"parsed {metrics['eval/parse_rate']:.2f}")
    return ", ".join(parts)


def run(name: str, run_file: str, overrides: dict[str, object], out: Path) -> str:
    from cmlrl_agents.cli.plan import build_trainer, plan
    from cmlrl_agents.cli.tasks import apply_overrides, load_spec

    sets = {**overrides, "config.output_dir": str(out / run_file), "config.verbose": False}
    spec = apply_overrides(
        load_spec(ROOT / "examples" / "configs" / run_file), [f"{k}={v}" for k, v in sets.items()]
    )
    start = time.perf_counter()
    p = plan(spec)
    trainer = build_trainer(p, use_wandb=False)
    n = p.config.eval_num_samples
    before = trainer.evaluate_items(n)
    trainer.train()
    after = trainer.evaluate_items(n)
    trainer.close()
    wall = time.perf_counter() - start
    items = len(trainer.env.spec.dataset) * p.config.num_train_epochs
    print(json.dumps({"task": name, "before": before, "after": after, "wall_s": wall}), flush=True)
    return (
        f"| {name} | {items} × G={p.config.num_generations}, {p.config.max_new_tokens} tokens "
        f"| {headline(before)} | {headline(after)} | {wall:.0f} s |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["humaneval", "centralized", "writing"], default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (run_file, overrides) in RUNS.items():
            key = run_file.removesuffix(".yaml").replace("humaneval_", "")
            if args.only is None or args.only == key:
                rows.append(run(name, run_file, overrides, Path(tmp)))
    print("| task | training | eval before | eval after | wall time |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
