"""Side-by-side benchmark: this library's MAGRPO against the reference ``comlrl==1.4.3``.

Both train two SmolLM2-135M-Instruct agents (G = 4) on the same task items of
the seed's tasks (1 turn: length ratio; 2 turns: length feedback, every branch expanded), with
every completion forced to exactly ``--tokens`` tokens (``min_new_tokens = max_new_tokens``) so
both do the same generation work. The reference fine-tunes two full copies; ours runs the same
full fine-tuning (``full``, the same work) and adapter agents (``lora``: one frozen base held once,
a LoRA adapter per agent over q/k/v/o, r = 16, one generate call per turn for both agents).
Each run is a fresh child process (the reference in a throwaway virtualenv), timed around
``trainer.train()`` only; peak memory is the child's max RSS.

    python benchmarks/vs_comlrl.py --turns 1 --items 8
    python benchmarks/vs_comlrl.py --turns 2 --items 4
    python benchmarks/vs_comlrl.py --turns 1 --items 2 --tokens 16 --setups lora   # a quick look
    python benchmarks/vs_comlrl.py --turns 1 --items 4 --bf16   # ours with bf16 autocast
    python benchmarks/vs_comlrl.py --turns 1 --items 4 --generation-backend hf_bf16
    #   ours sampling from bfloat16 copies of the agents (with the truncated importance weights)

With ``--repeats N`` every side runs N times, each repeat in another order (rotated: comlrl,
full, lora; then full, lora, comlrl; ...), so that a machine whose speed drifts within minutes
loads every side alike; each repeat's ratios come from its own runs, and the summary gives their
median and range (the FLOP shares are counted in the first repeat only).

    python benchmarks/vs_comlrl.py --turns 1 --items 4 --threads 1 --repeats 3

Prints seconds per task item, generated tokens per second and peak RSS for both, and the ratios;
for ours also the share of the machine's peak (``benchmarks/peak.py``): the FLOPs of the training
run, counted in one more epoch over the same items after the timed one (2 turns: the second
turn's prompts hold the sampled text, so that epoch's prompts are as long only on average), over
the timed run's process CPU seconds, against an fp32 matrix multiply timed the same way in the
same child process at the same threads; generation (our agents' ``generate_rows`` calls) and the
update (from the end of each round's last generation to its last optimizer step) apart. The
reference's rounds are not split (its generation and update are not reachable from outside).
Notes: the reference never applies a chat template, so ours runs with ``chat_template=False``
here for equal prompt lengths; with SmolLM2's tokenizer (pad == eos) the reference hands its
reward ``''`` (bug B1) but still does the same forward/backward work.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import textwrap
from pathlib import Path

from option_checks import refuse_below_one
from peak import format_shares

# The throwaway-virtualenv and child-process helpers are shared with benchmarks/learning.py.
from reference_env import reference_python
from reference_env import run_child as run

COMMON = textwrap.dedent("""
    import json, resource, sys, time
    import torch
    torch.manual_seed(0)
    from cmlrl_env import tasks
    spec = json.loads(sys.argv[1])
    turns, items, tokens, model = spec["turns"], spec["items"], spec["tokens"], spec["model"]
    def first(dataset, n):  # rows repeat in order when n exceeds the dataset
        return dataset.select([i % len(dataset) for i in range(n)])
    if turns == 1:
        train = first(tasks.length_ratio_dataset(), items)
        task = dict(formatters=[tasks.brief_formatter, tasks.detailed_formatter],
                    reward_func=tasks.length_ratio_reward)
    else:
        train = first(tasks.feedback_dataset(), items)
        task = dict(reward_func=tasks.feedback_ratio_reward,
                    external_transition=tasks.length_feedback)
    def peak_rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    def report(seconds, rollouts, share=None, peak=None):
        peak = peak_rss() if peak is None else peak
        print("RESULT " + json.dumps({"seconds": seconds, "items": items, "share": share,
                                      "tokens": rollouts * 2 * tokens, "peak_gb": peak}))
""")

OURS = COMMON + textwrap.dedent("""
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
    config = MAGRPOConfig(num_agents=2, num_turns=turns, num_train_epochs=1, num_generations=4,
                          max_new_tokens=tokens, min_new_tokens=tokens, eval_interval=0,
                          logging_steps=1, early_termination_threshold=None, seed=0,
                          output_dir=spec["out"], bf16=spec["bf16"],
                          generation_backend=spec["generation_backend"])
    peft = None
    if spec["setup"] == "lora":
        from peft import LoraConfig
        peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        config.agent_learning_rate = 1e-4  # a LoRA rate; the work per step is the same
    trainer = MAGRPOTrainer(agent_model=model, train_dataset=train, args=config,
                            model_config={"chat_template": False}, peft_config=peft, **task)
    sys.path.insert(0, spec["benchmarks"])
    from peak import RoundMeter, matmul_peak
    from cmlrl_agents import LLMAgent
    meter = RoundMeter("cpu", [(LLMAgent, "generate_rows")], clock=time.process_time)
    start = time.perf_counter()
    meter.time(trainer.train)
    seconds, rollouts, peak = time.perf_counter() - start, trainer.env_step, peak_rss()
    share = None
    if spec.get("count", True):
        config.num_train_epochs += 1  # the same items again, FLOPs counted (slow: not timed)
        meter.count(trainer.train)
        share = meter.figures(matmul_peak("cpu", torch.float32, clock=time.process_time))
    report(seconds, rollouts, share, peak)
""")

REFERENCE_RUN = COMMON + textwrap.dedent("""
    from comlrl.trainers.reinforce import MAGRPOConfig, MAGRPOTrainer
    config = MAGRPOConfig(num_agents=2, num_turns=turns, num_train_epochs=1, num_generations=4,
                          max_new_tokens=tokens, eval_interval=0, logging_steps=1,
                          early_termination_threshold=None)
    trainer = MAGRPOTrainer(agent_model=model, num_agents=2, train_dataset=train, args=config,
                            **task)
    start = time.perf_counter()
    trainer.train(min_new_tokens=tokens)  # forwarded to generate during training rollouts
    seconds = time.perf_counter() - start
    report(seconds, items * (4 if turns == 1 else 4 + 4 * 4))  # every branch is expanded
""")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--items", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--setups",
        nargs="+",
        choices=["full", "lora"],
        default=["full", "lora"],
        help="ours: full fine-tuning (the reference's work) and/or adapter agents",
    )
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "comlrl-venv")
    parser.add_argument(
        "--bf16", action="store_true", help="ours with bf16=True (the training passes autocast)"
    )
    parser.add_argument(
        "--generation-backend",
        choices=["hf", "hf_bf16"],
        default="hf",
        help="ours: the config's generation_backend (hf_bf16: sample from bfloat16 copies)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of every side, each repeat in another order"
    )
    args = parser.parse_args(argv)
    refuse_below_one(parser, args, ("items", "tokens", "threads", "repeats"))
    return args


def run_order(sides: list[str], repeat: int) -> list[str]:
    """The order of the sides in repeat ``repeat`` (from 0): rotated by one per repeat."""
    shift = repeat % len(sides)
    return sides[shift:] + sides[:shift]


def ratios(runs: list[dict[str, dict]], setup: str) -> tuple[list[float], list[float]]:
    """Each repeat's speed ratio (the reference's seconds per item over ours) and memory ratio
    (our peak over the reference's) for ``setup``, from that repeat's own runs."""
    speed, memory = [], []
    for results in runs:
        ref, ours = results["comlrl"], results[f"cmlrl-{setup}"]
        speed.append((ref["seconds"] / ref["items"]) / (ours["seconds"] / ours["items"]))
        memory.append(ours["peak_gb"] / ref["peak_gb"])
    return speed, memory


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)

    from cmlrl_agents.policies.agent import smollm2_path

    model = str(smollm2_path())
    ref_python = reference_python(args.venv)
    print(
        f"model: SmolLM2-135M-Instruct ({model}); 2 agents, G=4, {args.tokens} forced tokens, "
        f"{args.items} items, {args.threads} threads"
        + (", ours with bf16=True" if args.bf16 else "")
        + f", ours with generation_backend={args.generation_backend!r}"
        + (f", {args.repeats} repeats in rotated order" if args.repeats > 1 else "")
    )
    width = 18 if args.repeats > 1 else 12  # room for "cmlrl-full run 3"
    header = f"{'turns':>5} {'library':>{width}} {'s/item':>8} {'tok/s':>8} {'peak GB':>8}"
    print(header + "  share of the fp32 matmul peak (ours)")
    sides = ["comlrl"] + [f"cmlrl-{setup}" for setup in args.setups]
    for turns in args.turns:
        runs = []
        for repeat in range(args.repeats):
            results: dict[str, dict] = {}
            with tempfile.TemporaryDirectory() as out:
                spec = {
                    "turns": turns,
                    "items": args.items,
                    "tokens": args.tokens,
                    "model": model,
                    "out": out,
                    "bf16": args.bf16,
                    "generation_backend": args.generation_backend,
                    "benchmarks": str(Path(__file__).resolve().parent),
                    "count": repeat == 0,
                }
                for side in run_order(sides, repeat):
                    if side == "comlrl":
                        results[side] = run(ref_python, REFERENCE_RUN, spec, args.threads)
                    else:
                        spec["setup"] = side.removeprefix("cmlrl-")
                        results[side] = run(sys.executable, OURS, spec, args.threads)
            runs.append(results)
            label = f" run {repeat + 1}" if args.repeats > 1 else ""
            for name in sides:
                r = results[name]
                print(
                    f"{turns:>5} {name + label:>{width}} {r['seconds'] / r['items']:>8.2f} "
                    f"{r['tokens'] / r['seconds']:>8.1f} {r['peak_gb']:>8.2f}  "
                    + (format_shares(r["share"], per="CPU s") if r["share"] else "not split")
                )
        for setup in args.setups:
            speed, memory = ratios(runs, setup)
            if args.repeats == 1:
                print(
                    f"{turns:>5} {'ratio ' + setup:>{width}} {speed[0]:>7.2f}x faster per item; "
                    f"peak memory {memory[0]:.2f}x the reference's"
                )
                continue
            median = statistics.median(speed)
            print(
                f"{turns:>5} {'ratio ' + setup:>{width}} {median:>7.2f}x faster per item, the "
                f"median of {args.repeats} repeats ({min(speed):.2f}-{max(speed):.2f}x: "
                + ", ".join(f"{x:.2f}" for x in speed)
                + f"); peak memory {statistics.median(memory):.2f}x the reference's "
                f"({min(memory):.2f}-{max(memory):.2f}x)"
            )


if __name__ == "__main__":
    main()
