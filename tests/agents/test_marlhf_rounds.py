"""MARLHF's iterative rounds, its keywords (team vs the RL phase's rl_options) and adapter agents,
on tiny offline models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel

from cmlrl_agents import (
    IACConfig,
    MAGRPOConfig,
    MARLHFConfig,
    MARLHFTrainer,
    PreferenceRewardModel,
)
from cmlrl_agents.algorithms.preference_pairs import load_pairs
from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.reference import BaseWithoutAdapters
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.testing import (
    SyncRecorder,
    tiny_agent,
    tiny_model,
    tiny_reward_model,
    tiny_tokenizer,
)
from cmlrl_env import TaskSpec, tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]
AGENTS = ["agent_0", "agent_1"]
RL = dict(num_generations=2, max_new_tokens=6, eval_interval=4, eval_num_samples=2)
LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def reward_model() -> PreferenceRewardModel:
    tokenizer = tiny_tokenizer()
    return PreferenceRewardModel(tiny_reward_model(len(tokenizer)), tokenizer, device="cpu")


def make_trainer(out: Path, *, rl_args=None, team=None, **kw) -> MARLHFTrainer:
    train, evaluation = tasks.length_ratio_splits()
    defaults = dict(max_new_tokens=6, eval_num_samples=2, seed=0, reward_learning_rate=1e-3)
    rl = rl_args if rl_args is not None else MAGRPOConfig(**RL, agent_learning_rate=1e-2)
    team = team if team is not None else {"agents": [tiny_agent(seed=0), tiny_agent(seed=1)]}
    return MARLHFTrainer(
        **team,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=train,
        eval_dataset=evaluation,
        reward_model=reward_model(),
        args=MARLHFConfig(**{**defaults, **kw}, rl_args=rl, output_dir=str(out)),
    )


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def same_weights(a: MARLHFTrainer, b: MARLHFTrainer) -> None:
    for x, y in zip(a.agents, b.agents, strict=True):
        for (name, p), q in zip(x.model.named_parameters(), y.model.parameters(), strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)
    want = a.reward_model.model.state_dict()
    for name, value in b.reward_model.model.state_dict().items():
        torch.testing.assert_close(value, want[name], rtol=0, atol=0, msg=name)


def test_round_two_builds_its_pairs_from_the_policy_round_one_trained(tmp_path):
    rl_args = MAGRPOConfig(**RL, agent_learning_rate=1e-2, save_steps=8)
    trainer = make_trainer(tmp_path / "run", num_iterations=2, replay_iterations=1, rl_args=rl_args)
    trainer.train()
    folder = tmp_path / "run" / "preference"
    first, second = (load_pairs(folder / f"pairs-00{k}.jsonl", AGENTS) for k in (0, 1))
    assert first != second
    logged = rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["preference/iteration"] for r in logged if "preference/pairs" in r] == [0.0, 1.0]
    fits = [r for r in logged if "reward_model/eval_accuracy" in r]
    assert len(fits) == 2 and fits[0]["reward_model/replay_pairs"] == 0
    assert 0 < fits[1]["reward_model/replay_pairs"] < len(first)  # round 0's training part
    # Two rounds of (8 items x 4 candidates for pairs, 8 items x 2 generations of RL).
    assert trainer.env_step == 2 * (32 + 16)
    assert [r["env_step"] for r in logged if "preference/pairs" in r] == [32, 80]
    # Round 1's pairs are exactly what the weights after round 0 sample (round 1's sampling
    # keys), and not what the initial weights sample with the same keys.
    checkpoint = tmp_path / "run" / "rl" / "checkpoints" / "checkpoint-8"
    trained = make_trainer(tmp_path / "trained", num_iterations=2, rl_args=rl_args)
    trained.rl_trainer.load_checkpoint(checkpoint)
    initial = make_trainer(tmp_path / "initial", num_iterations=2, rl_args=rl_args)
    built = [other.build_pairs(1) for other in (trained, initial)]
    assert built[0] == second
    assert [p.chosen for p in built[1]] != [p.chosen for p in second]


def test_resume_inside_a_later_round_and_across_rounds_equals_the_uninterrupted_run(tmp_path):
    rl_args = MAGRPOConfig(**RL, agent_learning_rate=1e-2, save_steps=4)
    kw = dict(num_iterations=2, eval_interval=0, rl_args=rl_args)
    full = make_trainer(tmp_path / "full", **kw)
    full.train()
    # Inside round 1's RL phase (4 of its 8 items done), the saved pairs and reward model read back.
    inside = make_trainer(tmp_path / "full", **kw)
    inside.train(resume_from_checkpoint=tmp_path / "full" / "rl" / "checkpoints" / "checkpoint-12")
    same_weights(full, inside)
    assert inside.env_step == full.env_step == 96
    # A run stopped after round 0 (num_iterations=1), continued for a second round: its pairs,
    # reward model and RL phase are built from the saved policy and equal the full run's.
    stopped = make_trainer(tmp_path / "stopped", **{**kw, "num_iterations": 1})
    stopped.train()
    continued = make_trainer(tmp_path / "stopped", **kw)
    continued.train(resume_from_checkpoint="latest")
    same_weights(full, continued)
    assert continued.env_step == 96
    folder = "preference/pairs-001.jsonl"
    assert load_pairs(tmp_path / "stopped" / folder, AGENTS) == load_pairs(
        tmp_path / "full" / folder, AGENTS
    )
    assert continued.reward_metrics == full.reward_metrics
    # MARLHF's own metrics (pairs, reward model) continue in one file, as in the full run.
    assert inside.logger.history == continued.logger.history == full.logger.history
    for run in ("full", "stopped"):
        assert not list((tmp_path / run).glob("metrics.1.*"))
        assert rows(tmp_path / run / "metrics.jsonl") == rows(tmp_path / "full" / "metrics.jsonl")


def test_resuming_a_later_round_without_rl_checkpoints_is_refused(tmp_path):
    kw = dict(num_iterations=2, eval_interval=0)
    make_trainer(tmp_path / "run", **kw).train()  # rl_args.save_steps = 0: no checkpoint
    with pytest.raises(ValueError, match=r"reached round 1 .* set rl_args.save_steps > 0"):
        make_trainer(tmp_path / "run", **kw).train(resume_from_checkpoint="latest")


def test_rl_options_reach_the_rl_phase_and_misplaced_keywords_say_where_they_go(tmp_path):
    seen = []

    def callback(rollouts):
        seen.append(len(rollouts))
        return {"custom/rollouts": float(len(rollouts))}

    train, evaluation = tasks.length_ratio_splits()
    common = dict(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=train,
        eval_dataset=evaluation,
        reward_model=reward_model(),
    )
    iac = MARLHFConfig(
        max_new_tokens=6,
        rl_algorithm="iac",
        output_dir=str(tmp_path / "iac"),
        rl_args=IACConfig(**RL, use_separate_critic=False),
    )
    trainer = MARLHFTrainer(**common, args=iac, rl_options={"metrics_callback": callback})
    assert trainer.rl_trainer.metrics_callback is callback
    trainer.train()
    assert seen and any("custom/rollouts" in r for r in rows(tmp_path / "iac/rl/metrics.jsonl"))
    magrpo = MARLHFConfig(output_dir=str(tmp_path / "m"))
    with pytest.raises(TypeError, match=r"rl_options=\{'critic_model': \.\.\.\}"):
        MARLHFTrainer(**common, args=iac, critic_model="gpt2")
    with pytest.raises(TypeError, match=r"\['critic_model'\], which MAGRPOTrainer .* takes \["):
        MARLHFTrainer(**common, args=magrpo, rl_options={"critic_model": "gpt2"})
    with pytest.raises(TypeError, match=r"\['train_dataset'\], which the RL phase shares"):
        MARLHFTrainer(**common, args=magrpo, rl_options={"train_dataset": train})
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['formatter'\]"):
        MARLHFTrainer(**common, args=magrpo, formatter=tasks.brief_formatter)
    with pytest.raises(TypeError, match="external_transition"):
        MARLHFTrainer(**common, args=magrpo, external_transition=lambda **kw: None)


def test_a_task_spec_is_the_rl_phases_task_with_the_learned_reward(tmp_path):
    train, evaluation = tasks.length_ratio_splits()
    trainer = MARLHFTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        task=TaskSpec(train, FORMATTERS, tasks.length_ratio_reward, num_agents=2),
        eval_dataset=evaluation,
        reward_model=reward_model(),
        args=MARLHFConfig(early_termination_threshold=-0.2, output_dir=str(tmp_path / "t")),
    )
    rl = trainer.rl_trainer
    assert rl.env.spec.reward_func is trainer.reward_model
    assert rl.env.spec.dataset is train and rl.agents == trainer.agents
    assert rl.eval_env.spec.reward_func is tasks.length_ratio_reward  # evaluation: task reward


def test_bad_rl_configs_are_refused():
    # MARLHFConfig checks rl_args itself, when built and on assignment: before any file is written.
    with pytest.raises(ValueError, match="use 'constant' .* or num_iterations=1"):
        MARLHFConfig(num_iterations=2, rl_args=MAGRPOConfig(lr_scheduler_type="linear"))
    with pytest.raises(ValueError, match="rl_args.num_turns=2: .* use num_turns=1"):
        MARLHFConfig(rl_args=MAGRPOConfig(num_turns=2))
    config = MARLHFConfig(rl_algorithm="iac", rl_args=IACConfig())
    with pytest.raises(TypeError, match="rl_algorithm='magrpo' needs rl_args to be a MAGRPOConfig"):
        config.rl_algorithm = "magrpo"
    with pytest.raises(ValueError, match="num_iterations must be"):
        MARLHFConfig(num_iterations=0)
    with pytest.raises(ValueError, match="places its references with rl_args.reference_devices"):
        MARLHFConfig(reference_devices="cpu")
    with pytest.raises(
        ValueError, match="MARLHF's evaluations are its RL phase's; set them on rl_args"
    ):
        MARLHFConfig(save_best_by="eval/turn_1/reward_mean")


def test_adapter_agents_train_in_the_rl_phase_over_one_base_and_the_reward_model_stays_apart(
    base_folder, tmp_path
):
    rl_args = MAGRPOConfig(**RL, agent_learning_rate=1e-2, reference_kl_enabled=True, save_steps=8)
    team = {"agent_model": str(base_folder), "num_agents": 2, "peft_config": LORA}
    trainer = make_trainer(tmp_path / "run", rl_args=rl_args, team=team)
    model = trainer.agents[0].model
    assert isinstance(model, PeftModel) and trainer.agents[1].model is model
    assert [a.model for a in trainer.rl_trainer.agents] == [model, model]
    refs = trainer.rl_trainer.reference_models
    assert (
        refs[0] is refs[1] and isinstance(refs[0], BaseWithoutAdapters) and refs[0].model is model
    )
    agent_storage = {p.data_ptr() for p in model.parameters()}
    assert not agent_storage & {p.data_ptr() for p in trainer.reward_model.model.parameters()}
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    trainer.train()
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    for name, p in model.named_parameters():
        if "lora_B" in name:  # starts at zero; every adapter's moves
            assert not torch.equal(p, adapters[name]), name
    logged = rows(tmp_path / "run" / "rl" / "metrics.jsonl")
    assert any("loss" in r and "turn_1/reference_kl_mean" in r for r in logged)
    checkpoint = tmp_path / "run" / "rl" / "checkpoints" / "checkpoint-8"
    assert [p.name for p in checkpoint.glob("model-*")] == ["model-shared_base_0.safetensors"]
    tokenizer = tiny_tokenizer()
    batch = build_batch([[1, 5, 6, 7]], [[10, 11, 12]], tokenizer.pad_token_id)
    torch.testing.assert_close(
        refs[0].logprobs(batch), sequence_logprobs(tiny_model(len(tokenizer), 0), batch)
    )
    trainer.save_model(tmp_path / "saved")
    for agent in trainer.agents:
        loaded = PeftModel.from_pretrained(
            tiny_model(len(tokenizer), 0), tmp_path / "saved" / agent.adapter
        )
        torch.testing.assert_close(sequence_logprobs(loaded, batch), agent.score(batch).detach())


def test_the_pairs_and_the_rl_phase_generate_through_one_backend_with_marlhfs_settings(tmp_path):
    trainer = make_trainer(tmp_path / "run", num_iterations=2, temperature=0.9, eval_interval=0)
    trainer.generation_backend = spy = SyncRecorder(trainer.generation_backend)
    assert trainer.rl_trainer.generation_backend is spy
    assert trainer.rl_trainer.args.temperature == 0.9  # rl_args left it at its default
    trainer.train()
    # Round 1's pairs come after round 0's RL updates, each followed by a sync.
    assert spy.calls[0] == 0 and spy.syncs > 0 and spy.calls[-1] > 0
    with pytest.raises(ValueError, match=r"rl_args.temperature=0.7 differs from temperature=0.9"):
        MARLHFConfig(temperature=0.9, rl_args=MAGRPOConfig(temperature=0.7))


def test_the_rl_phase_plays_marlhfs_task_with_its_termination_threshold(tmp_path):
    trainer = make_trainer(tmp_path / "run", early_termination_threshold=0.3, eval_interval=0)
    assert trainer.rl_trainer.spec.early_termination_threshold == 0.3
    assert trainer.rl_trainer.args.early_termination_threshold == 0.3
    with pytest.raises(ValueError, match=r"rl_args.early_termination_threshold=0.5 differs"):
        MARLHFConfig(
            early_termination_threshold=0.3,
            rl_args=MAGRPOConfig(early_termination_threshold=0.5),
        )


def test_the_optimizers_and_references_are_the_rl_phases(tmp_path):
    rl = MAGRPOConfig(**RL, agent_learning_rate=1e-2, reference_kl_enabled=True)
    trainer = make_trainer(tmp_path / "run", rl_args=rl)
    assert trainer.optimizers == trainer.rl_trainer.optimizers
    assert len(trainer.optimizers) == 2
    assert trainer.reference_models is trainer.rl_trainer.reference_models
    assert trainer.reference_models is not None and len(trainer.reference_models) == 2
    trainer.close()
