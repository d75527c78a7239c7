"""Preference-based RL on the seed's length-ratio task: MADPO and MARLHF (SPEC §5).

Two agents (brief, detailed) answer each prompt; the task reward is the seed's length ratio.
MADPO samples joint candidates from the current policy, ranks them by the task reward into pairs
and runs DPO against the frozen initial policy, ``--iterations`` times. MARLHF turns the same
kind of pairs into a Bradley-Terry reward model (held-out pair accuracy printed) and runs MAGRPO
on the learned reward. Both are evaluated with the task reward, before and after.

    python examples/preference.py                 # SmolLM2-135M-Instruct, offline, CPU
    python examples/preference.py --tiny          # tiny random models, seconds (for tests)
    python examples/preference.py --algorithm madpo --iterations 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from cmlrl_agents import (
    MADPOConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MARLHFConfig,
    MARLHFTrainer,
    PreferenceRewardModel,
)
from cmlrl_env import tasks

KEY = "eval/turn_1/reward_mean"


def team(tiny: bool) -> dict:
    if tiny:
        from cmlrl_agents.tiny_models import tiny_agent

        return {"agents": [tiny_agent(seed=0), tiny_agent(seed=1)]}
    from cmlrl_agents import smollm2_path

    return {"agent_model": str(smollm2_path())}  # one independent copy per agent


def untrained_reward_model(tiny: bool) -> PreferenceRewardModel:
    if tiny:
        from cmlrl_agents.tiny_models import tiny_reward_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        return PreferenceRewardModel(tiny_reward_model(len(tokenizer)), tokenizer, device="cpu")
    from cmlrl_agents import smollm2_path

    return PreferenceRewardModel.from_pretrained(str(smollm2_path()), max_length=256)


def shared_settings(args: argparse.Namespace, eval_size: int) -> dict:
    return dict(
        num_agents=2,
        max_new_tokens=args.max_new_tokens,
        temperature=0.8,
        top_p=0.95,
        agent_learning_rate=args.learning_rate,
        eval_num_samples=eval_size,
        eval_batch_size=eval_size,
        seed=args.seed,
        verbose=True,
    )


def run(name: str, trainer, eval_size: int) -> dict:
    start = time.perf_counter()
    before = trainer.evaluate(eval_size)
    trainer.train()
    after = trainer.evaluate(eval_size)
    minutes = (time.perf_counter() - start) / 60
    trainer.close()
    print(f"{name} {KEY}: before {before[KEY]:.3f} -> after {after[KEY]:.3f} ({minutes:.1f} min)")
    return {"before": before[KEY], "after": after[KEY], "minutes": minutes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", choices=["madpo", "marlhf", "both"], default="both")
    parser.add_argument("--iterations", type=int, default=2, help="MADPO rounds")
    parser.add_argument("--candidates", type=int, default=4, help="joint candidates per item")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--eval-repeats", type=int, default=4)
    parser.add_argument("--output-dir", default="runs/preference")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny random models, for tests")
    args = parser.parse_args()

    train_dataset, eval_dataset = tasks.length_ratio_splits()
    eval_dataset = eval_dataset.select(
        [i for i in range(len(eval_dataset)) for _ in range(args.eval_repeats)]
    )
    task = dict(
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
    )
    common = shared_settings(args, len(eval_dataset))
    out, results = Path(args.output_dir), {}
    if args.algorithm in ("madpo", "both"):
        config = MADPOConfig(
            **common,
            num_iterations=args.iterations,
            preference_num_candidates=args.candidates,
            eval_interval=0,  # evaluated by hand below, before and after
            output_dir=str(out / "madpo"),
        )
        results["madpo"] = run(
            "MADPO", MADPOTrainer(**team(args.tiny), **task, args=config), len(eval_dataset)
        )
    if args.algorithm in ("marlhf", "both"):
        rl = MAGRPOConfig(**common, num_generations=4, eval_interval=0, rollout_buffer_size=2)
        config = MARLHFConfig(
            **common,
            preference_num_candidates=args.candidates,
            reward_num_train_epochs=3,
            reward_learning_rate=1e-4 if not args.tiny else 1e-3,
            eval_interval=0,
            rl_args=rl,
            output_dir=str(out / "marlhf"),
        )
        reward_model = untrained_reward_model(args.tiny)
        trainer = MARLHFTrainer(**team(args.tiny), **task, args=config, reward_model=reward_model)
        results["marlhf"] = run("MARLHF", trainer, len(eval_dataset))
        accuracy = trainer.reward_metrics["reward_model/eval_accuracy"]
        results["marlhf"]["reward_model_eval_accuracy"] = accuracy
        print(f"MARLHF reward model held-out pair accuracy: {accuracy:.3f}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
