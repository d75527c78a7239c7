"""Learning per second, out of the box: the seed's length-ratio program in comlrl 1.4.3 and ours.

Both libraries run the program a user of the seed writes (SPEC §5): two SmolLM2-135M-Instruct
agents from ``agent_model=<folder>``, chat-templated formatters written as a comlrl user writes
them (``tokenizer.apply_chat_template`` inside the formatter), G = 4, 48 new tokens, one turn,
and otherwise **each library's defaults** (learning rate, sampling, buffer and batch sizes).
Each run is a fresh child process (comlrl in a throwaway virtualenv with its own torch, see
``reference_env.py``). comlrl is evaluated before and after ``train()``, which is timed.

Ours records a learning curve: its own evaluation schedule (``eval_interval``) evaluates every
``--eval-every`` training items, and each evaluation is one point: items, optimizer rounds, the
training time so far (wall and process CPU, evaluations excluded) and the eval reward with its
standard error. Each evaluation draws from the run's one eval sampling key: all points see the
same eval noise and training does not depend on how often it is evaluated, so a curve in rounds
is the same on a loaded and a quiet machine; only its seconds change. ``--program all10`` trains
on the seed's 10 prompts and evaluates on the same 10 (the out-of-the-box measurement of
``benchmarks/defaults.py``); the default trains on the 8-item split and evaluates the 2 others.
From the curve it prints the issue's two targets: the training time at which ours first reaches
comlrl's final reward, and our reward at comlrl's training time
(``--match-comlrl-time`` or ``--budget-seconds`` stop ours there, ``--epochs`` is then the most
it trains; both are CPU seconds, which equal wall seconds on one quiet thread).

    python benchmarks/learning.py                          # 8 items x 2 epochs, both libraries
    python benchmarks/learning.py --match-comlrl-time --epochs 8 --comlrl-epochs 2  # the targets
    python benchmarks/learning.py --items 2 --epochs 1     # a short check
    python benchmarks/learning.py --only cmlrl --lr 2e-5 --yardstick 0.726 610  # ours vs a
    #   comlrl figure measured earlier (reward, seconds); --set FIELD=VALUE for other fields

comlrl needs one workaround to learn at all: with SmolLM2's tokenizer (pad == eos, and the chat
template holds eos) it cuts every prompt at its first pad token and hands the reward ``''``
(bug B1), so its tokenizer gets ``<|endoftext|>`` as a distinct pad token. Ours needs none.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

from reference_env import reference_python, run_child

COMMON = textwrap.dedent("""
    import json, sys, time
    import torch
    spec = json.loads(sys.argv[1])
    # comlrl draws from torch's global generator (it has no seed of its own); ours draws from
    # its config's seed and keeps 0 here.
    torch.manual_seed(spec["torch_seed"])
    from transformers import AutoTokenizer
    from cmlrl_env import tasks
    model = spec["model"]
    train, held_out = tasks.length_ratio_splits()
    if spec["program"] == "all10":  # the seed's 10 prompts, trained on and evaluated on
        train = held_out = tasks.length_ratio_dataset()
    train = train.select([i % len(train) for i in range(spec["items"])])
    # Every held-out prompt several times: the eval mean is over more joint responses.
    eval_data = held_out.select([i for i in range(len(held_out)) for _ in range(spec["repeats"])])
    tokenizer = AutoTokenizer.from_pretrained(model)
    def chat(text):  # as a comlrl user writes a formatter for an instruct model
        messages = [{"role": "user", "content": text}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    formatters = [lambda item: chat(tasks.brief_formatter(item)),
                  lambda item: chat(tasks.detailed_formatter(item))]
    program = dict(formatters=formatters, reward_func=tasks.length_ratio_reward,
                   train_dataset=train, eval_dataset=eval_data)
    settings = dict(num_agents=2, num_turns=1, num_train_epochs=spec["epochs"], num_generations=4,
                    max_new_tokens=48, eval_interval=0, eval_num_samples=len(eval_data))
    settings.update(spec["overrides"])
    def key_of(metrics):
        return next(k for k in metrics if k.endswith("reward_mean") and "turn_1" in k)
    def measure(trainer):
        before = trainer.evaluate(num_eval_samples=len(eval_data))
        start, start_cpu = time.perf_counter(), time.process_time()
        trainer.train()
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        after = trainer.evaluate(num_eval_samples=len(eval_data))
        key = key_of(after)
        print("RESULT " + json.dumps({"before": before[key], "after": after[key],
                                      "seconds": seconds, "cpu_seconds": cpu, "key": key}))
""")

OURS = COMMON + textwrap.dedent("""
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
    eval_settings = dict(eval_interval=spec["eval_every"], eval_batch_size=len(eval_data))
    config = MAGRPOConfig(**settings | eval_settings, seed=spec["seed"], output_dir=spec["out"])

    class BudgetReached(Exception):
        pass

    def reward_rows(*, agent_completions_turns, batch_items, prompts):
        brief, detailed = agent_completions_turns
        return [{"reward": tasks.length_ratio_reward([b[0]], [d[0]], batch_items=[item])[0]}
                for b, d, item in zip(brief, detailed, batch_items)]

    def reward_se(rows, *, num_turns):  # the standard error of one evaluation's mean
        values = torch.tensor([row["reward"] for row in rows], dtype=torch.float64)
        return {"reward_se": float(values.std() / len(values) ** 0.5)}

    class CurveTrainer(MAGRPOTrainer):
        # Each scheduled evaluation (every eval_every items) is one point of the learning curve.
        # Its time is kept out of the training time; the library's evaluation draws from the
        # run's one eval key (every point sees the same eval noise) and changes no training
        # sample.
        curve, eval_wall, eval_cpu = [], 0.0, 0.0

        def evaluate_items(self, num_eval_samples):
            wall, cpu = time.perf_counter(), time.process_time()
            point = {"items": self.items_seen, "rounds": self.rounds,
                     "train_s": wall - self.start_wall - self.eval_wall,
                     "train_cpu_s": cpu - self.start_cpu - self.eval_cpu}
            metrics = super().evaluate_items(num_eval_samples)
            self.eval_wall += time.perf_counter() - wall
            self.eval_cpu += time.process_time() - cpu
            point.update(reward=metrics[key_of(metrics)], se=metrics["eval/reward_se"])
            self.curve.append(point)
            print("POINT " + json.dumps(point), flush=True)
            if spec["budget"] is not None and point["train_cpu_s"] >= spec["budget"]:
                raise BudgetReached  # the budget is spent: this point is the last
            return metrics

    trainer = CurveTrainer(agent_model=model, args=config, eval_logger=reward_rows,
                           eval_aggregator=reward_se, **program)
    trainer.start_wall, trainer.start_cpu = time.perf_counter(), time.process_time()
    try:
        trainer.train()
        trainer.evaluate()
    except BudgetReached:
        pass
    curve = trainer.curve
    print("RESULT " + json.dumps({"before": curve[0]["reward"], "after": curve[-1]["reward"],
                                  "seconds": curve[-1]["train_s"],
                                  "cpu_seconds": curve[-1]["train_cpu_s"], "curve": curve,
                                  "items_per_step": config.items_per_step}))
""")
REFERENCE_RUN = COMMON + textwrap.dedent("""
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    # Bug B1's workaround: a pad token that the chat template does not contain.
    pad_tokenizer = AutoTokenizer.from_pretrained(model)
    pad_tokenizer.pad_token = "<|endoftext|>"
    config = MAGRPOConfig(**settings)
    measure(MAGRPOTrainer(agent_model=model, num_agents=2, tokenizer=pad_tokenizer, args=config,
                          **program))
""")

PROGRAMS = {"comlrl": REFERENCE_RUN, "cmlrl": OURS}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=8, help="training items (8: the train split)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs (with a budget: at most)")
    parser.add_argument(
        "--comlrl-epochs",
        type=int,
        help="comlrl's epochs (default: --epochs), so ours can train "
        "longer than comlrl under --match-comlrl-time",
    )
    parser.add_argument("--eval-repeats", type=int, default=8, help="samples of each eval prompt")
    parser.add_argument("--eval-every", type=int, default=4, help="our curve: items between evals")
    parser.add_argument("--only", choices=sorted(PROGRAMS), help="run one library only")
    parser.add_argument("--lr", type=float, help="our agent_learning_rate (default: ours)")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        type=override,
        help="another MAGRPOConfig field of ours, e.g. temperature=0.8 (repeatable)",
    )
    parser.add_argument("--comlrl-lr", type=float, help="comlrl's (default: its 5e-6)")
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="our config's seed; comlrl, which has none, seeds torch's global generator with it",
    )
    parser.add_argument(
        "--program",
        choices=("split", "all10"),
        default="split",
        help="split: train 8 items, evaluate the 2 held out; all10: train and evaluate the 10",
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget-seconds", type=float, help="stop ours after this training CPU")
    budget.add_argument(
        "--match-comlrl-time", action="store_true", help="budget = comlrl's training CPU seconds"
    )
    parser.add_argument(
        "--yardstick",
        type=float,
        nargs=2,
        metavar=("REWARD", "SECONDS"),
        help="comlrl's final reward and training seconds, when it is not run (--only cmlrl)",
    )
    parser.add_argument(
        "--keep-run",
        type=Path,
        help="keep our run folder here (config.json, metrics.jsonl; with --set logging_steps=1 "
        "every round's training metrics)",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "comlrl-venv")
    parser.add_argument("--model", help="model folder (default: the local SmolLM2-135M-Instruct)")
    args = parser.parse_args(argv)
    for name in ("items", "epochs", "eval_repeats", "eval_every", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.comlrl_epochs is not None and args.comlrl_epochs < 1:
        parser.error(f"--comlrl-epochs must be at least 1, got {args.comlrl_epochs}")
    if args.budget_seconds is not None and args.budget_seconds <= 0:
        parser.error(f"--budget-seconds must be > 0, got {args.budget_seconds}")
    if args.match_comlrl_time and args.only == "cmlrl":
        parser.error(
            "--match-comlrl-time runs comlrl first; drop --only cmlrl, or give --budget-seconds"
        )
    if args.keep_run is not None and args.only == "comlrl":
        parser.error("--keep-run keeps our run folder, and --only comlrl runs none; drop one")
    return args


def override(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` with VALUE read as JSON (a number, true/false, null), else as text."""
    field, sep, value = text.partition("=")
    if not sep or not field:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE, got {text!r}")
    try:
        return field, json.loads(value)
    except json.JSONDecodeError:
        return field, value


def time_to_reach(curve: list[dict], reward: float) -> dict | None:
    """The first curve point at or above ``reward`` (None if none): an upper bound on the time,
    since the curve is sampled every ``--eval-every`` items."""
    return next((point for point in curve if point["reward"] >= reward), None)


def reward_at(curve: list[dict], seconds: float, clock: str) -> dict:
    """The last curve point trained no longer than ``seconds`` on ``clock``."""
    return [point for point in curve if point[clock] <= seconds][-1]


def print_curve(curve: list[dict], items_per_step: int) -> None:
    print(f"{'rounds':>6} {'items':>5} {'steps':>5} {'train s':>8} {'cpu s':>8} {'reward':>13}")
    for p in curve:
        print(
            f"{p['rounds']:>6} {p['items']:>5} {p['items'] // items_per_step:>5} "
            f"{p['train_s']:>8.1f} {p['train_cpu_s']:>8.1f} {p['reward']:>7.3f} ± {p['se']:.3f}"
        )


def print_targets(ours: dict, ref_reward: float, ref_seconds: float) -> None:
    """The issue's two targets on ours' curve, in process CPU seconds of training."""
    hit = time_to_reach(ours["curve"], ref_reward)
    if hit is None:
        print(f"time to reach comlrl's final reward {ref_reward:.3f}: not reached")
    else:
        print(
            f"time to reach comlrl's final reward {ref_reward:.3f}: <= {hit['train_cpu_s']:.1f} "
            f"CPU s ({hit['rounds']} rounds), {hit['train_cpu_s'] / ref_seconds:.2f}x comlrl's "
            f"{ref_seconds:.1f} s (target <= 0.20x)"
        )
    if ours["curve"][-1]["train_cpu_s"] < ref_seconds:
        print("our reward at comlrl's time: not trained that long (raise --epochs)")
        return
    at = reward_at(ours["curve"], ref_seconds, "train_cpu_s")
    print(
        f"our reward at comlrl's time ({ref_seconds:.1f} s): {at['reward']:.3f} ± {at['se']:.3f} "
        f"(last eval at or before it, {at['train_cpu_s']:.1f} CPU s; target >= 0.85)"
    )


def run(name: str, args: argparse.Namespace, budget: float | None) -> dict:
    python = reference_python(args.venv) if name == "comlrl" else sys.executable
    if name == "comlrl":
        overrides = {} if args.comlrl_lr is None else {"agent_learning_rate": args.comlrl_lr}
    else:
        overrides = {} if args.lr is None else {"agent_learning_rate": args.lr}
        overrides.update(dict(args.set))
    keep = args.keep_run if name == "cmlrl" else None
    with contextlib.nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory() as out:
        spec = {
            "model": args.model,
            "items": args.items,
            "epochs": args.comlrl_epochs or args.epochs if name == "comlrl" else args.epochs,
            "repeats": args.eval_repeats,
            "eval_every": args.eval_every,
            "program": args.program,
            "seed": args.seed,
            "torch_seed": args.seed if name == "comlrl" else 0,
            "budget": budget,
            "overrides": overrides,
            "out": out,
        }
        result = run_child(python, PROGRAMS[name], spec, args.threads)
    result["settings"] = overrides or "defaults"
    return result


def main(argv: list[str] | None = None) -> dict[str, dict]:
    args = parse_args(argv)
    if args.model is None:
        from cmlrl_agents import smollm2_path

        args.model = str(smollm2_path())
    names = [args.only] if args.only else ["comlrl", "cmlrl"]
    print(
        f"model {args.model}; 2 agents, G=4, 48 tokens, {args.items} items x {args.epochs} "
        f"epochs, eval {args.eval_repeats}x each eval prompt every "
        f"{args.eval_every} items, seed {args.seed}, {args.threads} threads"
    )
    results: dict[str, dict] = {}
    for name in names:
        budget = args.budget_seconds
        if name == "cmlrl" and args.match_comlrl_time:
            budget = results["comlrl"]["cpu_seconds"]
        r = results[name] = run(name, args, budget)
        print(
            f"{name}: {r['settings']}: before {r['before']:.3f}, after {r['after']:.3f} "
            f"({r['after'] - r['before']:+.3f}), training {r['seconds']:.1f} s wall, "
            f"{r['cpu_seconds']:.1f} s CPU"
        )
        if name == "cmlrl":
            print_curve(r["curve"], r["items_per_step"])
    if "cmlrl" in results:
        ref = results.get("comlrl")
        if ref is not None:
            print_targets(results["cmlrl"], ref["after"], ref["cpu_seconds"])
        elif args.yardstick is not None:
            print_targets(results["cmlrl"], *args.yardstick)
    return results


if __name__ == "__main__":
    main()
