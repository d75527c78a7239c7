"""Peak memory of a team: 1, 2 and 4 adapter agents on one base against as many full copies.

Each setting is a fresh child process that builds a MAGRPO trainer over SmolLM2-135M-Instruct
(``agent_model=``, N agents, G = 2) and trains one round of one task item with ``--tokens``
forced tokens; the peak is the child's max RSS (everything: python, torch, the models, the
optimizer state, activations). Adapter agents: ``peft_config=LoraConfig(r=16, q/k/v/o)``, so
each extra agent should cost about its adapter and its adapter's AdamW state, not a model.

    python benchmarks/memory.py
    python benchmarks/memory.py --agents 1 2 4 --tokens 16

Prints the peak per setting and the cost of each agent beyond the first.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import json, resource, sys, tempfile
    import torch
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
    from cmlrl_env import tasks
    spec = json.loads(sys.argv[1])
    n, tokens = spec["agents"], spec["tokens"]

    def reward(*completions, batch_items):  # any team size: longer first answers score more
        return [min(len(text), 40) / 40 for text in completions[0]]

    peft = None
    if spec["setup"] == "lora":
        from peft import LoraConfig
        peft = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    with tempfile.TemporaryDirectory() as out:
        config = MAGRPOConfig(num_agents=n, num_generations=2, max_new_tokens=tokens,
                              min_new_tokens=tokens, eval_interval=0, rollout_buffer_size=1,
                              seed=0, output_dir=out, verbose=False)
        trainer = MAGRPOTrainer(agent_model=spec["model"], args=config, peft_config=peft,
                                formatters=[tasks.brief_formatter] * n, reward_func=reward,
                                train_dataset=tasks.length_ratio_dataset().select(range(1)),
                                model_config={"chat_template": False})
        trainer.train()
        models = {id(a.model): a.model for a in trainer.agents}.values()
        held = sum(p.numel() for m in models for p in m.parameters())
        trainable = sum(p.numel() for a in trainer.agents for p in a.trainable_parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    print("RESULT " + json.dumps({"peak_gb": peak, "held": held, "trainable": trainable}))
""")


def run(spec: dict, threads: int) -> dict:
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(spec)], capture_output=True, text=True, env=env
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    from cmlrl_agents.policies.agent import smollm2_path

    model = str(smollm2_path())
    print(
        f"model: SmolLM2-135M-Instruct; G=2, 1 item, {args.tokens} tokens, {args.threads} thread(s)"
    )
    print(f"{'setup':>6} {'agents':>6} {'peak GB':>8} {'params held':>12} {'trainable':>10}")
    peaks: dict[str, dict[int, float]] = {"full": {}, "lora": {}}
    for setup in ("full", "lora"):
        for n in args.agents:
            spec = {"setup": setup, "agents": n, "tokens": args.tokens, "model": model}
            r = run(spec, args.threads)
            peaks[setup][n] = r["peak_gb"]
            print(
                f"{setup:>6} {n:>6} {r['peak_gb']:>8.2f} {r['held'] / 1e6:>11.1f}M "
                f"{r['trainable'] / 1e6:>9.2f}M"
            )
    first = min(args.agents)
    for setup, by_n in peaks.items():
        for n, peak in by_n.items():
            if n > first:
                extra = (peak - by_n[first]) / (n - first) * 1024
                print(f"{setup}: each agent beyond {first} costs {extra:.0f} MB (to {n} agents)")


if __name__ == "__main__":
    main()
