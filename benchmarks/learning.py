"""Learning per second, out of the box: the seed's length-ratio program in comlrl 1.4.3 and ours.

Both libraries run the program a user of the seed writes (SPEC §5): two SmolLM2-135M-Instruct
agents from ``agent_model=<folder>``, chat-templated formatters written as a comlrl user writes
them (``tokenizer.apply_chat_template`` inside the formatter), G = 4, 48 new tokens, one turn,
and otherwise **each library's defaults** (learning rate, sampling, buffer and batch sizes).
Each library evaluates the held-out prompts before and after training (``evaluate()``) and is
timed around ``train()`` only; each run is a fresh child process (comlrl in a throwaway
virtualenv with its own torch, see ``reference_env.py``).

    python benchmarks/learning.py                          # 8 items x 2 epochs, both libraries
    python benchmarks/learning.py --items 2 --epochs 1     # a short check
    python benchmarks/learning.py --only cmlrl --lr 2e-5   # ours with another learning rate

comlrl needs one workaround to learn at all: with SmolLM2's tokenizer (pad == eos, and the chat
template holds eos) it cuts every prompt at its first pad token and hands the reward ``''``
(bug B1), so its tokenizer gets ``<|endoftext|>`` as a distinct pad token. Ours needs none.
Prints eval reward before/after, the gain, training seconds, and the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import textwrap
from pathlib import Path

from reference_env import reference_python, run_child

COMMON = textwrap.dedent("""
    import json, sys, time
    import torch
    torch.manual_seed(0)
    from transformers import AutoTokenizer
    from cmlrl_env import tasks
    spec = json.loads(sys.argv[1])
    model = spec["model"]
    train, held_out = tasks.length_ratio_splits()
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
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        after = trainer.evaluate(num_eval_samples=len(eval_data))
        key = key_of(after)
        print("RESULT " + json.dumps({"before": before[key], "after": after[key],
                                      "seconds": seconds, "key": key}))
""")

OURS = COMMON + textwrap.dedent("""
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
    config = MAGRPOConfig(**settings, seed=0, output_dir=spec["out"])
    measure(MAGRPOTrainer(agent_model=model, args=config, **program))
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
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--eval-repeats", type=int, default=4, help="samples of each eval prompt")
    parser.add_argument("--only", choices=sorted(PROGRAMS), help="run one library only")
    parser.add_argument("--lr", type=float, help="our agent_learning_rate (default: ours)")
    parser.add_argument("--comlrl-lr", type=float, help="comlrl's (default: its 5e-6)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "comlrl-venv")
    parser.add_argument("--model", help="model folder (default: the local SmolLM2-135M-Instruct)")
    args = parser.parse_args(argv)
    for name in ("items", "epochs", "eval_repeats", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.model is None:
        from cmlrl_agents import smollm2_path

        args.model = str(smollm2_path())
    lrs = {"cmlrl": args.lr, "comlrl": args.comlrl_lr}
    names = [args.only] if args.only else ["comlrl", "cmlrl"]
    print(
        f"model {args.model}; 2 agents, G=4, 48 tokens, {args.items} items x {args.epochs} "
        f"epochs, eval {args.eval_repeats}x each held-out prompt, {args.threads} threads"
    )
    print(f"{'library':>8} {'lr':>8} {'before':>7} {'after':>7} {'gain':>7} {'train s':>8}")
    results = {}
    for name in names:
        python = reference_python(args.venv) if name == "comlrl" else sys.executable
        overrides = {} if lrs[name] is None else {"agent_learning_rate": lrs[name]}
        with tempfile.TemporaryDirectory() as out:
            spec = {
                "model": args.model,
                "items": args.items,
                "epochs": args.epochs,
                "repeats": args.eval_repeats,
                "overrides": overrides,
                "out": out,
            }
            r = results[name] = run_child(python, PROGRAMS[name], spec, args.threads)
        lr = "default" if lrs[name] is None else f"{lrs[name]:g}"
        print(
            f"{name:>8} {lr:>8} {r['before']:>7.3f} {r['after']:>7.3f} "
            f"{r['after'] - r['before']:>+7.3f} {r['seconds']:>8.1f}"
        )
    if len(results) == 2:
        ref, ours = results["comlrl"], results["cmlrl"]
        print(
            f"ratio: ours trains in {ours['seconds'] / ref['seconds']:.2f}x comlrl's time; "
            f"final reward {ours['after'] / ref['after']:.2f}x comlrl's"
        )


if __name__ == "__main__":
    main()
