"""What a run must not depend on, and what it records: evaluation changes no weight, a seed
makes a run (LoRA adapters and value heads included) bit-identical, rounds are never cut at
eval points, the config a run uses is what config.json says, and the best model is kept."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset
from peft import LoraConfig
from test_magrpo_trainer import make_trainer

from cmlrl_agents import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.runs.checkpoint_load import CheckpointError
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_tokenizer
from cmlrl_env import tasks

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def weights(trainer) -> dict[str, torch.Tensor]:
    return {
        f"{i}.{name}": p.detach().clone()
        for i, agent in enumerate(trainer.agents)
        for name, p in agent.model.named_parameters()
        if p.requires_grad
    }


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def record_evaluations(trainer, key: str = "eval/turn_1/reward_mean") -> list:
    """Wrap ``trainer.evaluate_items``: each evaluation's ``key`` and the weights it saw."""
    seen: list[tuple[float, dict[str, torch.Tensor]]] = []
    evaluate = trainer.evaluate_items

    def record(n):
        metrics = evaluate(n)
        seen.append((metrics[key], weights(trainer)))
        return metrics

    trainer.evaluate_items = record
    return seen


def test_evaluation_changes_no_weight(tmp_path) -> None:
    runs = []
    for interval in (0, 2, 3):
        trainer = make_trainer(
            tmp_path / str(interval), eval_interval=interval, seed=7, num_train_epochs=2
        )
        trainer.train()
        runs.append(weights(trainer))
    assert_identical(runs[0], runs[1])
    assert_identical(runs[0], runs[2])


def test_rounds_are_never_cut_at_eval_points_and_eval_runs_at_the_next_boundary(tmp_path):
    trainer = make_trainer(tmp_path, rollout_buffer_size=3, eval_interval=4, seed=0)
    sizes, evals = [], []
    update = trainer.learner.update
    trainer.learner.update = lambda batch: sizes.append(batch.num_items) or update(batch)
    evaluate = trainer.evaluate_items
    trainer.evaluate_items = lambda n: evals.append(trainer.epoch_position) or evaluate(n)
    trainer.train()
    assert sizes == [3, 3, 2]  # 8 items in rounds of 3; the eval points 0 and 4 cut nothing
    assert evals == [0, 6]  # eval point 4 is served at the first boundary after it, 6


def _lora_trainer(tmp_path, base_folder, seed: int) -> MAGRPOTrainer:
    train, _ = tasks.length_ratio_splits()
    args = MAGRPOConfig(
        num_agents=2,
        rollout_buffer_size=4,
        num_generations=2,
        max_new_tokens=4,
        eval_interval=0,
        seed=seed,
        output_dir=str(tmp_path / f"lora-{seed}"),
        overwrite_output_dir=True,
    )
    return MAGRPOTrainer(
        agent_model=str(base_folder),
        peft_config=LORA,
        reward_func=tasks.length_ratio_reward,
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        train_dataset=train,
        args=args,
    )


def test_a_seed_makes_lora_runs_bit_identical_from_their_first_weights(tmp_path, base_folder):
    first, second = _lora_trainer(tmp_path, base_folder, 3), _lora_trainer(tmp_path, base_folder, 3)
    # peft draws lora_A at random: the seed is applied before the adapters are built
    assert_identical(weights(first), weights(second))
    assert any("lora_A" in name for name in weights(first))
    first.train()
    second.train()
    assert_identical(weights(first), weights(second))
    other = _lora_trainer(tmp_path, base_folder, 4)
    assert any(not torch.equal(v, weights(first)[k]) for k, v in weights(other).items())


def test_a_seed_makes_value_heads_identical_and_none_leaves_them_random(tmp_path):
    def heads(seed):
        train, _ = tasks.length_ratio_splits()
        args = IACConfig(
            num_agents=2,
            use_separate_critic=False,
            eval_interval=0,
            seed=seed,
            output_dir=str(tmp_path / f"iac-{seed}"),
        )
        trainer = IACTrainer(
            agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
            reward_func=tasks.length_ratio_reward,
            formatters=[tasks.brief_formatter, tasks.detailed_formatter],
            train_dataset=train,
            args=args,
        )
        return [c.head.state_dict() for c in trainer.critics]

    one, two = heads(5), heads(5)
    for a, b in zip(one, two, strict=True):
        for key in a:
            assert torch.equal(a[key], b[key])
    other = heads(6)
    assert not torch.equal(one[0]["net.weight"], other[0]["net.weight"])


def test_a_run_repeats_out_of_the_box_and_seed_none_records_the_seed_it_drew(tmp_path) -> None:
    # No seed given: the default (42, Hugging Face's) makes two runs one run, as in TRL.
    runs = [make_trainer(tmp_path / str(i), eval_interval=0) for i in range(2)]
    for trainer in runs:
        trainer.train()
    assert runs[0].args.seed == 42 and runs[0].sample_seed == runs[1].sample_seed == 42
    assert_identical(weights(runs[0]), weights(runs[1]))
    drawn = [make_trainer(tmp_path / f"none-{i}", eval_interval=0, seed=None) for i in range(2)]
    assert drawn[0].sample_seed != drawn[1].sample_seed
    for trainer in drawn:
        config = json.loads((trainer.run_dir / "config.json").read_text())
        assert config["seed"] is None and config["sample_seed"] == trainer.sample_seed


def test_config_json_records_what_the_run_uses(tmp_path) -> None:
    trainer = make_trainer(tmp_path, eval_interval=0, agent_learning_rate=1e-3)
    trainer.args.agent_learning_rate = 5e-4
    trainer.train()
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["agent_learning_rate"] == 5e-4
    assert trainer.optimizers[0].param_groups[0]["lr"] == 5e-4


def test_save_only_model_checkpoints_hold_the_weights_and_refuse_to_resume(tmp_path) -> None:
    trainer = make_trainer(tmp_path, eval_interval=0, save_steps=4, save_only_model=True)
    trainer.train()
    folder = tmp_path / "run" / "checkpoints" / "checkpoint-8"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["model-agent_0.safetensors", "model-agent_1.safetensors", "trainer_state.json"]
    again = make_trainer(tmp_path, eval_interval=0, save_steps=4, save_only_model=True)
    with pytest.raises(CheckpointError, match="save_only_model=True: it holds the weights alone"):
        again.train(resume_from_checkpoint="latest")


def test_the_best_model_is_kept_and_loaded_at_the_end(tmp_path) -> None:
    trainer = make_trainer(
        tmp_path,
        eval_interval=2,
        num_train_epochs=2,
        seed=1,
        save_best_by="eval/turn_1/reward_mean",
        load_best_model_at_end=True,
    )
    seen = record_evaluations(trainer)
    trainer.train()
    best_value, best_weights = max(seen, key=lambda pair: pair[0])  # the first of equal maxima
    assert trainer.best_metric == best_value
    assert_identical(weights(trainer), best_weights)
    assert (tmp_path / "run" / "best").is_dir()
    # The run's counters stay at its end (the best checkpoint's env_step is earlier unless the
    # last evaluation was best): an evaluation after it logs in order, as `cmlrl train`'s does.
    end = trainer.env_step
    assert end == trainer.logger.history[-1][0]
    trainer.evaluate()
    assert trainer.env_step == end and trainer.logger.history[-1][0] == end


def test_a_trainer_that_has_logged_refuses_to_resume_before_anything_changes(tmp_path) -> None:
    make_trainer(tmp_path, eval_interval=0, save_steps=4).train()
    again = make_trainer(tmp_path, eval_interval=2, save_steps=4)
    before, run_id = weights(again), again.run_id
    again.evaluate()
    with pytest.raises(RuntimeError, match="has already logged"):
        again.train(resume_from_checkpoint="latest")
    assert_identical(weights(again), before)
    assert again.run_id == run_id and again.items_seen == 0 and again.env_step == 0


def test_save_best_by_is_checked_when_the_config_is_built() -> None:
    with pytest.raises(ValueError, match="save_best_by must be an evaluation metric"):
        MAGRPOConfig(save_best_by="loss")
    with pytest.raises(ValueError, match="needs evaluations during training"):
        MAGRPOConfig(save_best_by="eval/turn_1/reward_mean", eval_interval=0)
    with pytest.raises(ValueError, match="load_best_model_at_end=True needs save_best_by"):
        MAGRPOConfig(load_best_model_at_end=True)


def test_a_round_logs_the_diagnostics(tmp_path) -> None:
    trainer = make_trainer(
        tmp_path, eval_interval=0, rollout_buffer_size=4, train_batch_size=2, max_new_tokens=5
    )
    metrics = trainer.train()
    for key in (
        "completions/length_mean",
        "completions/length_min",
        "completions/length_max",
        "completions/clipped_fraction",
        "groups/zero_spread_fraction",
        "agent_0/entropy",
        "agent_0/grad_norm",
        "agent_1/ratio_mean",
        "agent_1/ratio_max",
        "agent_1/clipfrac",
        "agent_1/approx_kl",
    ):
        assert key in metrics, key
    assert 1 <= metrics["completions/length_min"] <= metrics["completions/length_max"] <= 5
    assert metrics["agent_0/entropy"] > 0


def test_adamw_weight_decay_is_the_configs(tmp_path) -> None:
    data = Dataset.from_dict({"prompt": ["a"]})
    trainer = MAGRPOTrainer(
        agents=[tiny_agent()],
        reward_func=lambda c: [0.0] * len(c),
        train_dataset=data,
        args=MAGRPOConfig(weight_decay=0.05, output_dir=str(tmp_path / "run"), eval_interval=0),
    )
    assert trainer.optimizers[0].param_groups[0]["weight_decay"] == 0.05
    assert MAGRPOConfig().weight_decay == 0.0


def test_adamw_moments_and_epsilon_are_the_configs_for_agents_and_critics(tmp_path) -> None:
    data = Dataset.from_dict({"prompt": ["a"]})
    options = {"adam_beta1": 0.0, "adam_beta2": 0.99, "adam_epsilon": 1e-6}
    magrpo = MAGRPOTrainer(
        agents=[tiny_agent()],
        reward_func=lambda c: [0.0] * len(c),
        train_dataset=data,
        args=MAGRPOConfig(**options, output_dir=str(tmp_path / "magrpo"), eval_interval=0),
    )
    tokenizer = tiny_tokenizer()
    iac = IACTrainer(
        agents=[tiny_model(len(tokenizer), 0)],
        critics=[tiny_model(len(tokenizer), 1)],
        tokenizer=tokenizer,
        reward_func=lambda c: [0.0] * len(c),
        train_dataset=data,
        args=IACConfig(**options, output_dir=str(tmp_path / "iac"), eval_interval=0),
    )
    for optimizer in [*magrpo.optimizers, *iac.optimizers, *iac.critic_optimizers]:
        group = optimizer.param_groups[0]
        assert (group["betas"], group["eps"]) == ((0.0, 0.99), 1e-6)
    defaults = MAGRPOConfig()
    assert (defaults.adam_beta1, defaults.adam_beta2, defaults.adam_epsilon) == (0.9, 0.999, 1e-8)
