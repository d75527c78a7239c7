"""The code reward before and after, in one run: its cost per program and what it pays.

    python benchmarks/code_reward.py                    # main's code against this checkout
    python benchmarks/code_reward.py --before REV --repeats 2 --train-round

Both implementations score the same HumanEval programs, each in a process of its own (the
"before" tree is ``git archive REV cmlrl_env``), alternating, ``--repeats`` times (the fastest
pass counts): the 164 canonical solutions (as ``aux``, with a main that calls it), honest wrong
answers (each canonical solution with its first comparison flipped, or else its first integer
constant moved by one, where that still compiles), and the anti-cheat suite's hostile programs
(``tests/env/cheats.py``). Programs go to the reward one problem at a time, as in training, on
all cores. Printed: per kind, programs per second and milliseconds per program before and
after, and their ratio; the canonical solutions at the maximum; the honest wrong answers whose
reward changed; the hostile programs' rewards.

``--train-round`` also times one training round of ``examples/configs/humaneval.yaml`` (one
item, SmolLM2-135M on the CPU, minutes) and the reward's part of it, and the share the reward
would take if every program of the round ran in the sandbox, at the per-program cost measured
above before and after.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLIPS = {ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE, ast.LtE: ast.Gt, ast.Eq: ast.NotEq}


def _mutant(code: str) -> str | None:
    """``code`` with its first comparison flipped, or its first int constant moved by one."""
    tree = ast.parse(code)
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare) and type(n.ops[0]) in FLIPS]
    ints = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and type(n.value) is int]
    if compares:
        compares[0].ops[0] = FLIPS[type(compares[0].ops[0])]()
    elif ints:
        ints[0].value += 1
    else:
        return None
    return ast.unparse(tree)


def programs() -> list[dict[str, str]]:
    """Every program of the benchmark: kind, task id, helper and main completions."""
    sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "env")]
    from cheats import TRICKS

    from cmlrl_env.code_tasks import humaneval_problems

    out = []
    for task_id, p in humaneval_problems().items():
        entry = p["entry_point"]
        match = re.search(rf"^def {re.escape(entry)}\s*\(", p["prompt"], re.M)
        helper = "def aux(" + p["prompt"][match.end() :] + p["canonical_solution"]
        main = f"def {entry}(*args):\n    result = aux(*args)\n    return result\n"
        out.append({"kind": "canonical", "task_id": task_id, "helper": helper, "main": main})
        wrong = _mutant(helper)
        if wrong is not None:
            out.append({"kind": "wrong", "task_id": task_id, "helper": wrong, "main": main})
    for name, (task_id, helper, main, _) in TRICKS.items():
        out.append({"kind": "hostile", "task_id": task_id, "helper": helper, "main": main})
        out[-1]["name"] = name
    return out


def measure(tree: str, path: str) -> None:
    """In a child process: score the programs with the cmlrl_env found in ``tree``."""
    sys.path.insert(0, tree)
    from cmlrl_env.code_reward import score_batch
    from cmlrl_env.code_tasks import problem_of

    todo = json.loads(Path(path).read_text())
    groups = defaultdict(list)
    for i, p in enumerate(todo):
        groups[(p["kind"], p["task_id"])].append(i)
    rewards: list[float] = [0.0] * len(todo)
    seconds: dict[str, float] = defaultdict(float)
    for (kind, task_id), ids in groups.items():
        start = time.perf_counter()
        scores = score_batch(
            problem_of({"task_id": task_id}),
            [todo[i]["helper"] for i in ids],
            [todo[i]["main"] for i in ids],
        )
        seconds[kind] += time.perf_counter() - start
        for i, s in zip(ids, scores, strict=True):
            rewards[i] = s.reward
    print(json.dumps({"seconds": seconds, "rewards": rewards}))


def run_child(tree: Path, path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    command = [sys.executable, __file__, "--measure", str(tree), str(path)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_round() -> dict[str, float]:
    """One training round of the HumanEval run file: its wall time and the reward's part."""
    sys.path.insert(0, str(ROOT))
    import cmlrl_env.code_tasks as tasks
    from cmlrl_agents.cli.commands import build_trainer, plan
    from cmlrl_agents.cli.tasks import apply_overrides, load_spec

    spent = {"reward_s": 0.0, "programs": 0}
    original = tasks.score_batch

    def timed(problem, helpers, mains, *args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return original(problem, helpers, mains, *args, **kwargs)
        finally:
            spent["reward_s"] += time.perf_counter() - start
            spent["programs"] += len(helpers)

    tasks.score_batch = timed
    with tempfile.TemporaryDirectory() as out:
        sets = {"task.max_train_items": 1, "config.output_dir": out, "config.verbose": False}
        spec = apply_overrides(
            load_spec(ROOT / "examples" / "configs" / "humaneval.yaml"),
            [f"{k}={v}" for k, v in sets.items()],
        )
        trainer = build_trainer(plan(spec), use_wandb=False)
        start = time.perf_counter()
        trainer.train()
        spent["round_s"] = time.perf_counter() - start
        trainer.close()
    return spent


def extract(rev: str, folder: str) -> Path:
    """``cmlrl_env`` as of ``rev`` (``git archive``) in ``folder``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "cmlrl_env"], capture_output=True, check=True
    ).stdout
    target = Path(folder, "before")
    target.mkdir()
    with tempfile.TemporaryFile() as f:
        f.write(archive)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(target, filter="data")
    return target


def fastest(runs: list[dict]) -> dict[str, float]:
    seconds = {k: min(r["seconds"][k] for r in runs) for k in runs[0]["seconds"]}
    return {**seconds, "all": sum(seconds.values())}


def report(todo: list[dict], runs: dict[str, list[dict]]) -> dict[str, float]:
    """Print the tables; the seconds per program over all programs, before and after."""
    counts = defaultdict(int)
    for p in todo:
        counts[p["kind"]] += 1
    counts["all"] = len(todo)
    best = {side: fastest(r) for side, r in runs.items()}
    print("| programs | n | before: per s | ms each | after: per s | ms each | after/before |")
    print("|---|---|---|---|---|---|---|")
    for kind, n in counts.items():
        b, a = best["before"][kind], best["after"][kind]
        print(
            f"| {kind} | {n} | {n / b:.1f} | {1000 * b / n:.0f} | {n / a:.1f} | "
            f"{1000 * a / n:.0f} | {a / b:.2f}x |"
        )
    rewards = {side: r[0]["rewards"] for side, r in runs.items()}
    for kind in ("canonical", "wrong", "hostile"):
        ids = [i for i, p in enumerate(todo) if p["kind"] == kind]
        full = [sum(rewards[s][i] == 4.0 for i in ids) for s in ("before", "after")]
        mean = [sum(rewards[s][i] for i in ids) / len(ids) for s in ("before", "after")]
        changed = [i for i in ids if rewards["before"][i] != rewards["after"][i]]
        print(
            f"\n{kind}: at 4.0 {full[0]} before, {full[1]} after (of {len(ids)}); mean reward "
            f"{mean[0]:.3f} before, {mean[1]:.3f} after; {len(changed)} changed"
        )
        for i in changed:
            name = todo[i].get("name", todo[i]["task_id"])
            print(f"  {name}: {rewards['before'][i]:.3g} -> {rewards['after'][i]:.3g}")
    return {side: best[side]["all"] / counts["all"] for side in best}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="main", help="the git revision to compare with")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--train-round", action="store_true")
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        return measure(*args.measure)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    todo = programs()
    print(
        f"{len(todo)} programs, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, "
        f"before = {args.before}, {args.repeats} pass(es) each, alternating"
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "programs.json")
        path.write_text(json.dumps(todo))
        before = extract(args.before, tmp)
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for _ in range(args.repeats):
            runs["before"].append(run_child(before, path))
            runs["after"].append(run_child(ROOT, path))
    each = report(todo, runs)
    if args.train_round:
        spent = train_round()
        n, round_s = spent["programs"], spent["round_s"]
        print(
            f"\none training round (humaneval.yaml, 1 item): {round_s:.1f} s; the reward graded "
            f"{n} programs in {spent['reward_s']:.2f} s ({100 * spent['reward_s'] / round_s:.2f}%"
            " of the round; answers that fail the static gates never run)"
        )
        rest = round_s - spent["reward_s"]
        for side in ("before", "after"):
            reward = n * each[side]
            print(
                f"if all {n} ran, {side}: {n} x {1000 * each[side]:.0f} ms = {reward:.1f} s, "
                f"{100 * reward / (rest + reward):.2f}% of the round"
            )


if __name__ == "__main__":
    main()
