"""MARLHFTrainer on tiny offline models: pairs, reward model, RL on the learned reward, resume."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from cmlrl_agents import (
    IACConfig,
    MAGRPOConfig,
    MARLHFConfig,
    MARLHFIterConfig,
    MARLHFTrainer,
    PreferencePair,
    PreferenceRewardModel,
)
from cmlrl_agents.testing import tiny_agent, tiny_reward_model, tiny_tokenizer
from cmlrl_env import tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]
RL = dict(num_generations=2, max_new_tokens=6, eval_interval=4, eval_num_samples=2)


class CountingReward:
    """The task reward, counting its calls (one per task item scored)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, brief, detailed, *, batch_items):
        self.calls += 1
        return tasks.length_ratio_reward(brief, detailed, batch_items=batch_items)


def make_trainer(tmp_path, rl_algorithm="magrpo", rl_args=None, reward=None, **kw):
    train, evaluation = tasks.length_ratio_splits()
    tokenizer = tiny_tokenizer()
    args = MARLHFConfig(
        max_new_tokens=6,
        eval_num_samples=2,
        seed=0,
        reward_learning_rate=1e-3,
        rl_algorithm=rl_algorithm,
        rl_args=rl_args if rl_args is not None else MAGRPOConfig(**RL, agent_learning_rate=1e-3),
        output_dir=str(tmp_path / "run"),
        **kw,
    )
    return MARLHFTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=FORMATTERS,
        reward_func=reward if reward is not None else CountingReward(),
        train_dataset=train,
        eval_dataset=evaluation,
        args=args,
        reward_model=PreferenceRewardModel(
            tiny_reward_model(len(tokenizer)), tokenizer, device="cpu"
        ),
    )


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_magrpo_on_the_learned_reward_trains_and_evaluates_with_the_task_reward(tmp_path):
    reward = CountingReward()
    trainer = make_trainer(tmp_path, reward=reward)
    agents_before = [copy.deepcopy(a.model.state_dict()) for a in trainer.agents]
    trainer.train()
    for agent, old in zip(trainer.agents, agents_before, strict=True):
        assert any(not torch.equal(p.detach(), old[n]) for n, p in agent.model.named_parameters())
    phase = rows(tmp_path / "run" / "metrics.jsonl")
    keys = set().union(*phase)
    assert {"preference/pairs", "reward_model/eval_accuracy", "reward_model/loss"} <= keys
    rl = rows(tmp_path / "run" / "rl" / "metrics.jsonl")
    evals = [r for r in rl if "eval/turn_1/reward_mean" in r]
    assert any("loss" in r for r in rl) and evals
    # The task reward is called once per item: 8 for the pairs, 2 per evaluation (2 items);
    # RL training itself scores with the reward model only.
    assert reward.calls == 8 + 2 * len(evals)
    assert all(0.0 <= r["eval/turn_1/reward_mean"] <= 1.0 for r in evals)  # length ratio
    # One env_step axis: RL starts where pair building (8 items x 4 candidates) stopped.
    assert min(r["env_step"] for r in rl) == 32 and trainer.env_step == 32 + 8 * 2


def test_iac_on_the_learned_reward_changes_the_actors(tmp_path):
    rl_args = IACConfig(**RL, use_separate_critic=False, agent_learning_rate=1e-3)
    trainer = make_trainer(tmp_path, rl_algorithm="iac", rl_args=rl_args)
    before = copy.deepcopy(trainer.agents[0].model.state_dict())
    trainer.train()
    changed = [
        not torch.equal(p.detach(), before[n])
        for n, p in trainer.agents[0].model.named_parameters()
    ]
    assert any(changed)
    rl = rows(tmp_path / "run" / "rl" / "metrics.jsonl")
    assert any("agent_0/value_mean" in r for r in rl)


def test_resume_reads_every_finished_phase_back(tmp_path):
    rl_args = MAGRPOConfig(**RL, agent_learning_rate=1e-3, save_steps=4)
    full = make_trainer(tmp_path, rl_args=rl_args)
    full.train()
    reward = CountingReward()
    resumed = make_trainer(tmp_path, rl_args=rl_args, reward=reward)
    resumed.train(resume_from_checkpoint="latest")
    assert resumed.reward_metrics == full.reward_metrics  # the saved reward model, not refit
    saved = full.reward_model.model.state_dict()
    assert all(torch.equal(v, saved[k]) for k, v in resumed.reward_model.model.state_dict().items())
    # No pair was rebuilt and the RL phase was already complete: only the final evaluation.
    assert reward.calls == 2
    for a, b in zip(full.agents, resumed.agents, strict=True):
        for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.equal(p, q)


def test_bad_configs_are_refused(tmp_path):
    with pytest.raises(TypeError, match="rl_algorithm='iac' needs rl_args to be a IACConfig"):
        make_trainer(tmp_path, rl_algorithm="iac")
    with pytest.raises(ValueError, match="rl_algorithm must be one of"):
        MARLHFConfig(rl_algorithm="ppo")
    with pytest.raises(TypeError, match="rl_args must be the RL phase's config"):
        MARLHFConfig(rl_args={"num_generations": 2})
    with pytest.raises(ValueError, match="no reward model"):
        MARLHFTrainer(
            agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
            formatters=FORMATTERS,
            reward_func=tasks.length_ratio_reward,
            train_dataset=tasks.length_ratio_splits()[0],
            args=MARLHFConfig(output_dir=str(tmp_path / "x")),
        )
    assert MARLHFIterConfig is MARLHFConfig
    assert MARLHFConfig().reward_model_device is None  # no cuda:0 default (B11)


def test_an_unseeded_run_replays_the_training_part_of_its_earlier_rounds(tmp_path):
    # seed=None: the splits follow the run's drawn seed (kept by checkpoints), so round 1's
    # replay of round 0's saved pairs is round 0's training part, none of its held-out pairs.
    from cmlrl_agents.algorithms.preference_pairs import save_pairs

    tokenizer = tiny_tokenizer()
    trainer = MARLHFTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_splits()[0],
        reward_model=PreferenceRewardModel(
            tiny_reward_model(len(tokenizer)), tokenizer, device="cpu"
        ),
        args=MARLHFConfig(
            num_iterations=2, replay_iterations=1, seed=None, reward_eval_fraction=0.5,
            rl_args=MAGRPOConfig(eval_interval=0), output_dir=str(tmp_path / "run"),
        ),
    )  # fmt: skip
    fits = []
    update = trainer.reward_learner.update
    trainer.reward_learner.update = lambda fit: (fits.append(fit), update(fit))[1]
    for k in range(2):  # what a round does with its pairs
        pairs = [
            PreferencePair(("p", "q"), (f"r{k} good {i}", "a"), (f"r{k} bad {i}", "b"))
            for i in range(20)
        ]
        save_pairs(trainer.pairs_path(k), pairs, trainer.agent_names)
        trainer.fit_reward_model(pairs, k)
    replayed = {p.chosen for p in fits[1].train if p.chosen[0].startswith("r0")}
    assert replayed == {p.chosen for p in fits[0].train}
