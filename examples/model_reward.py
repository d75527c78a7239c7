"""SPEC §4's model reward: a reward model, loaded once outside the reward, as a ``reward_func``.

The reward model is trained here, offline, from preferences: joint responses of the seed's
length-ratio task written with random lengths, ranked by the task reward into pairs, fit with
the Bradley-Terry loss (held-out pair accuracy printed) and saved as a Hugging Face folder. It is
then loaded once with ``PreferenceRewardModel.from_pretrained(folder)`` on a free device and
given to MAGRPO as ``reward_func``: the trainer only uses the returned rewards and never moves
or updates it (checked at the end).

    python examples/model_reward.py          # SmolLM2-135M-Instruct backbone and agents, CPU
    python examples/model_reward.py --tiny   # tiny random models, seconds (for tests)
"""

from __future__ import annotations

import argparse
import random

import torch

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer, PreferenceRewardModel
from cmlrl_agents.algorithms.preference_pairs import PreferencePair, select_pairs
from cmlrl_agents.algorithms.reward_model import split_pairs
from cmlrl_env import tasks


def length_ratio_pairs(seed: int, candidates: int = 6) -> list[PreferencePair]:
    """Per training item, random-length joint texts ranked by the task reward."""
    rng = random.Random(seed)
    pairs = []
    for item in tasks.length_ratio_splits()[0]:
        joints = [
            (" ".join(["word"] * rng.randint(1, 8)), " ".join(["word"] * rng.randint(1, 24)))
            for _ in range(candidates)
        ]
        rewards = tasks.length_ratio_reward(*zip(*joints, strict=True), batch_items=[item])
        prompts = (tasks.brief_formatter(item), tasks.detailed_formatter(item))
        for w, lo in select_pairs(rewards, "reward_gap", 6, rng):
            pairs.append(PreferencePair(prompts, joints[w], joints[lo], item=dict(item)))
    return pairs


def untrained_reward_model(tiny: bool) -> PreferenceRewardModel:
    if tiny:
        from cmlrl_agents.tiny_models import tiny_reward_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        return PreferenceRewardModel(tiny_reward_model(len(tokenizer)), tokenizer, device="cpu")
    from cmlrl_agents import smollm2_path

    return PreferenceRewardModel.from_pretrained(str(smollm2_path()), max_length=256)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output-dir", default="runs/model-reward")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="tiny random models, for tests")
    args = parser.parse_args()

    # 1. Train the reward model from preferences and save it as a folder.
    train, held = split_pairs(length_ratio_pairs(seed=0), 0.25, seed=0)
    model = untrained_reward_model(args.tiny)
    metrics = model.fit(train, held, learning_rate=1e-3 if args.tiny else 5e-5, epochs=3, seed=0)
    print(f"reward model held-out pair accuracy: {metrics['reward_model/eval_accuracy']:.3f}")
    folder = f"{args.output_dir}/reward-model"
    model.model.save_pretrained(folder)
    model.tokenizer.save_pretrained(folder)

    # 2. Load it once, outside the reward function, and train agents on it.
    reward_model = PreferenceRewardModel.from_pretrained(folder, device="cpu").freeze()
    before = {k: v.clone() for k, v in reward_model.model.state_dict().items()}
    if args.tiny:
        from cmlrl_agents.tiny_models import tiny_agent

        agents = {"agents": [tiny_agent(seed=0), tiny_agent(seed=1)]}
    else:
        from cmlrl_agents import smollm2_path

        agents = {"agent_model": str(smollm2_path())}
    train_dataset, eval_dataset = tasks.length_ratio_splits()
    trainer = MAGRPOTrainer(
        **agents,
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=reward_model,  # a plain reward_func
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        args=MAGRPOConfig(
            num_generations=4,
            max_new_tokens=args.max_new_tokens,
            eval_interval=len(train_dataset),
            eval_num_samples=len(eval_dataset),
            output_dir=f"{args.output_dir}/magrpo",
        ),
    )
    trainer.train()
    after = trainer.evaluate()
    trainer.close()
    unchanged = all(torch.equal(v, before[k]) for k, v in reward_model.model.state_dict().items())
    print(f"eval/turn_1/reward_mean (learned reward): {after['eval/turn_1/reward_mean']:.3f}")
    print(f"reward model unchanged by training: {unchanged}; device: {reward_model.device}")


if __name__ == "__main__":
    main()
