"""Callbacks, critics, eval splits and reference KL in the trainers (issue 9: 6, 7, 14, 16, 23)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from datasets import Dataset

from cmlrl_agents import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import tasks

VOCAB = len(tiny_tokenizer())
FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]


def _config(cls, tmp_path, **overrides):
    fields = {
        "max_new_tokens": 6,
        "rollout_buffer_size": 2,
        "eval_interval": 0,
        "agent_learning_rate": 1e-3,
        "output_dir": str(tmp_path / "run"),
        "early_termination_threshold": None,
        "verbose": False,
    }
    return cls(**{**fields, **overrides})


def _build(cls, args, num_items=2, **kwargs):
    train, _ = tasks.length_ratio_splits()
    return cls(
        agents=[tiny_model(VOCAB, seed=i, eos_bias=4.0) for i in range(2)],
        tokenizer=tiny_tokenizer(),
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=train.select(range(num_items)),
        args=args,
        **kwargs,
    )


def _rows(tmp_path):
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


# ------------------------------------------- 6. metrics_callback logged at rollout collection
def test_metrics_callback_values_are_logged_at_collection_not_held_by_logging_steps(tmp_path):
    rounds = []

    def callback(rollouts):
        rounds.append(len(rollouts))
        return {"round": float(len(rounds))}

    args = _config(
        IACConfig,
        tmp_path,
        use_separate_critic=False,
        rollout_buffer_size=1,
        advantage_normalization=False,
        logging_steps=1000,  # training entries wait for the final flush
    )
    trainer = _build(IACTrainer, args, num_items=3, metrics_callback=callback)
    trainer.train()
    trainer.close()
    rows = _rows(tmp_path)
    # One entry per round at that round's env_step (1 joint action per single-turn item) ...
    assert [(r["env_step"], r["round"]) for r in rows if "round" in r] == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
    ]
    # ... while the three rounds' training values were averaged into one entry at the end.
    train_rows = [r for r in rows if "turn_1/reward_mean" in r]
    assert [r["env_step"] for r in train_rows] == [3]


# ----------------------------------------------- 7. a critic by name has its own tokenizer
def test_a_critic_given_by_name_loads_its_own_tokenizer(tmp_path):
    critic_tokenizer = tiny_tokenizer()
    critic_tokenizer.add_tokens(["<critic-only>"])
    folder = tmp_path / "critic"
    tiny_model(len(critic_tokenizer), seed=5).save_pretrained(folder)
    critic_tokenizer.save_pretrained(folder)
    args = _config(MAACConfig, tmp_path)
    trainer = _build(MAACTrainer, args, critic_model=str(folder))
    encoder = trainer.critic_encoders[0]
    assert encoder.tokenizer is not trainer.agents[0].tokenizer
    assert len(encoder.tokenizer) == VOCAB + 1  # the folder's tokenizer, not the actors' (259)
    assert encoder.tokenizer.convert_tokens_to_ids("<critic-only>") == VOCAB


# ------------------------------------------------------------- 14. an empty eval split
@pytest.mark.parametrize("iterable", [False, True])
def test_an_empty_eval_dataset_is_refused_at_construction(tmp_path, iterable):
    one = Dataset.from_list([{"prompt": "x"}])
    data = one.to_iterable_dataset().filter(lambda r: False) if iterable else one.select([])
    with pytest.raises(ValueError, match=r"eval_dataset is empty, so evaluation would score no"):
        _build(MAGRPOTrainer, _config(MAGRPOConfig, tmp_path, num_generations=2), eval_dataset=data)


# ---------------------------------------------------- 16. NaN/inf from user callbacks
def test_a_nan_from_eval_aggregator_raises_naming_it(tmp_path):
    _, evaluation = tasks.length_ratio_splits()
    trainer = _build(
        MAGRPOTrainer,
        _config(MAGRPOConfig, tmp_path, num_generations=2),
        eval_dataset=evaluation,
        eval_logger=lambda **kw: [{} for _ in kw["batch_items"]],
        eval_aggregator=lambda rows, *, num_turns: {"accuracy": math.nan},
    )
    with pytest.raises(ValueError, match=r"eval_aggregator returned 'accuracy': nan; metrics"):
        trainer.evaluate(num_eval_samples=1)
    assert not (tmp_path / "run" / "eval-metrics.json").exists()


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_a_non_finite_metrics_callback_value_raises_naming_it(tmp_path, value):
    trainer = _build(
        IACTrainer,
        _config(IACConfig, tmp_path, use_separate_critic=False),
        metrics_callback=lambda rollouts: {"score": value},
    )
    with pytest.raises(ValueError, match=r"metrics_callback returned 'score': (inf|-inf|nan)"):
        trainer.train()


def test_a_non_numeric_metrics_callback_value_raises_naming_it(tmp_path):
    trainer = _build(
        IACTrainer,
        _config(IACConfig, tmp_path, use_separate_critic=False),
        metrics_callback=lambda rollouts: {"score": "high"},
    )
    with pytest.raises(TypeError, match=r"metrics_callback returned 'score': 'high', which is"):
        trainer.train()


# ------------------------------------------------------------ 23. reference KL for IAC/MAAC
@pytest.mark.parametrize(
    ("cls", "config_class", "extra"),
    [
        (IACTrainer, IACConfig, {"use_separate_critic": False}),
        (MAACTrainer, MAACConfig, {}),
    ],
)
def test_actor_critics_apply_the_reference_kl_penalty(tmp_path, cls, config_class, extra):
    kwargs = {"critics": [tiny_model(VOCAB, seed=10)]} if cls is MAACTrainer else {}
    args = _config(
        config_class,
        tmp_path,
        reference_kl_enabled=True,
        reference_kl_coef=0.5,
        rollout_buffer_size=1,
        advantage_normalization=False,
        logging_steps=1,
        **extra,
    )
    trainer = _build(cls, args, num_items=3, **kwargs)
    references = [copy_params(m) for m in trainer.reference_models]
    trainer.train()
    rows = [r for r in _rows(tmp_path) if "turn_1/reference_kl_mean" in r]
    assert len(rows) == 3
    kl = [r["turn_1/reference_kl_mean"] for r in rows]
    assert kl[0] == pytest.approx(0.0, abs=1e-6)  # round 1: the policy is the reference
    assert kl[-1] > 0.0  # the actors moved away from it
    for row in rows:
        assert row["turn_1/reference_kl_penalty_mean"] == pytest.approx(
            0.5 * row["turn_1/reference_kl_mean"]
        )
        assert "agent_1/turn_1/reference_kl_mean" in row
    # The references stay frozen and are the policy alone (no value head attached).
    for model, before in zip(trainer.reference_models, references, strict=True):
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
        assert not any(p.requires_grad for p in model.parameters())


def test_the_reference_kl_term_changes_the_actor_update(tmp_path):
    def one_step(coef):
        args = _config(
            IACConfig,
            tmp_path,
            use_separate_critic=False,
            reference_kl_enabled=coef is not None,
            reference_kl_coef=0.1 if coef is None else coef,
            rollout_buffer_size=1,
            advantage_normalization=False,
            seed=0,
        )
        torch.manual_seed(0)  # the value head's initial weights
        trainer = _build(IACTrainer, args, num_items=2)
        trainer.train()
        return copy_params(trainer.agents[0].model)

    without, small, large = one_step(None), one_step(0.0), one_step(50.0)
    # coef 0 is the same update as no KL at all; a large coef pulls the second step elsewhere.
    assert all(torch.allclose(a, b) for a, b in zip(without, small, strict=True))
    assert not all(torch.allclose(a, b) for a, b in zip(without, large, strict=True))


def copy_params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_reference_kl_enabled_cannot_change_after_construction(tmp_path):
    trainer = _build(IACTrainer, _config(IACConfig, tmp_path, use_separate_critic=False))
    with pytest.raises((AttributeError, ValueError, TypeError), match="reference_kl_enabled"):
        trainer.args.reference_kl_enabled = True
    trainer.args.reference_kl_coef = 0.2  # read at every step: may change
