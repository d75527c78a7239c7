"""IAC and MAAC: hand-worked GAE over chains, value heads, training smoke tests, configs, eval."""

from __future__ import annotations

import functools
import inspect
import json
import math

import pytest
import torch
from datasets import Dataset

from cmlrl_agents.algorithms.actor_critic import IACTrainer, MAACTrainer, RolloutSample
from cmlrl_agents.algorithms.actor_critic_config import IACConfig, MAACConfig
from cmlrl_agents.algorithms.actor_critic_rollouts import agent_rollouts
from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.learning.credit import chain_credit
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.scripted import ScriptedPolicy
from cmlrl_agents.policies.value_head import ValueModel
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_tokenizer
from cmlrl_env import Task
from cmlrl_env.tasks import (
    brief_formatter,
    detailed_formatter,
    feedback_dataset,
    feedback_ratio_reward,
    length_feedback,
    length_ratio_dataset,
    length_ratio_reward,
)

SAMPLING = SamplingConfig(max_new_tokens=4)
VOCAB = len(tiny_tokenizer())

# ------------------------------------------------------------------ GAE over chains, by hand
# Item "A" plays two turns (r = 0.5, then 1.0); item "B" ends after turn 1 (r = 0.95 > 0.9).
REWARDS = {"A": 0.5, "A>": 1.0, "B": 0.95}


def chain_tree(num_generations: int = 1, num_turns: int = 2):
    def reward(c1, c2):
        return [REWARDS[a] for a in c1]

    def transition(prompt, agent_completions, num_agents, **history):
        return [agent_completions[0] + ">"] * num_agents

    task = Task(
        None,
        reward,
        num_agents=2,
        num_turns=num_turns,
        external_transition=transition,
        early_termination_threshold=0.9,
    )
    echo = ScriptedPolicy(lambda prompt, g: prompt)  # the answer names the state it came from
    items = [({"prompt": "A"}, 0), ({"prompt": "B"}, 1)]
    return collect_tree(
        task, [echo, echo], items, num_generations=num_generations, sampling=SAMPLING
    )


# V(A, turn 1) = 0.2, V(B, turn 1) = 0.3, V(A, turn 2) = 0.4.
STATE_VALUES = [torch.tensor([0.2, 0.3]), torch.tensor([0.4])]


@pytest.mark.parametrize(
    ("lam", "adv_a1", "ret_a1"),
    [
        # delta_2 = 1.0 - 0.4 = 0.6; delta_1 = 0.5 + 0.9 * 0.4 - 0.2 = 0.66
        (0.0, 0.66, 0.86),  # TD(0): target r_1 + gamma * V(s_2)
        (0.5, 0.66 + 0.9 * 0.5 * 0.6, 0.2 + 0.66 + 0.27),  # A_1 = delta_1 + gamma*lam*A_2
        (1.0, 0.5 + 0.9 * 1.0 - 0.2, 0.5 + 0.9 * 1.0),  # Monte-Carlo return
    ],
)
def test_chain_gae_two_turns_by_hand(lam: float, adv_a1: float, ret_a1: float) -> None:
    tree = chain_tree()
    assert [len(level.states) for level in tree.levels] == [2, 1]
    adv, ret = chain_credit(tree, STATE_VALUES, discount=0.9, lam=lam)
    # B ended after turn 1 of 2: terminal, absorbing its reward for the turn it did not play.
    torch.testing.assert_close(adv[0], torch.tensor([[adv_a1], [0.95 * 1.9 - 0.3]]))
    torch.testing.assert_close(ret[0], torch.tensor([[ret_a1], [0.95 * 1.9]]))
    # The last turn is terminal: no bootstrap, whatever lambda is.
    torch.testing.assert_close(adv[1], torch.tensor([[0.6]]))
    torch.testing.assert_close(ret[1], torch.tensor([[1.0]]))


def test_single_turn_generations_are_one_step_chains() -> None:
    tree = chain_tree(num_generations=3, num_turns=1)
    adv, ret = chain_credit(tree, [torch.tensor([0.2, 0.3])], discount=0.9, lam=0.95)
    torch.testing.assert_close(ret[0], torch.tensor([[0.5] * 3, [0.95] * 3]))
    torch.testing.assert_close(adv[0], torch.tensor([[0.3] * 3, [0.65] * 3]))


def test_chain_gae_refuses_a_branching_tree() -> None:
    tree = chain_tree(num_generations=2)
    with pytest.raises(ValueError, match="num_generations=1"):
        chain_credit(tree, [torch.zeros(2), torch.zeros(2)], discount=1.0, lam=1.0)


def test_agent_rollouts_carry_the_documented_fields() -> None:
    tree = chain_tree()
    adv, ret = chain_credit(tree, STATE_VALUES, discount=0.9, lam=0.0)
    samples = agent_rollouts(tree, 1, STATE_VALUES, adv, ret)
    assert [(s.turn, s.prompt, s.completion) for s in samples] == [
        (1, "A", "A"),
        (1, "B", "B"),
        (2, "A>", "A>"),
    ]
    first = samples[0]
    assert first.agent_idx == 1 and first.metadata["item"] == {"prompt": "A"}
    meta = first.metadata
    assert meta.pop("item") == {"prompt": "A"}
    assert meta == pytest.approx(
        {
            "turn": 1,
            "generation": 0,
            "item_index": 0,
            "reward": 0.5,
            "return": 0.86,
            "value": 0.2,
            "advantage": 0.66,
            "normalized_advantage": None,
        }
    )


# ------------------------------------------------------------------------------ value heads
def test_values_are_batched_padding_free_and_without_grad() -> None:
    agent = tiny_agent()
    critic = ValueModel(tiny_model(VOCAB, seed=3))
    rows = agent.encode_prompts(["hi", "a much longer prompt than the first"])
    both = critic.values(rows, agent.pad_token_id)
    alone = torch.cat([critic.values([r], agent.pad_token_id) for r in rows])
    torch.testing.assert_close(both, alone)
    assert not both.requires_grad
    assert critic.values(rows, agent.pad_token_id, grad=True).requires_grad


def test_shared_head_reads_the_scoring_forward_and_owns_only_the_head() -> None:
    from cmlrl_agents.policies.logprobs import sequence_logprobs
    from cmlrl_agents.policies.tokens import build_batch

    agent = tiny_agent()
    critic = ValueModel(agent.model, shared=True)
    assert {id(p) for p in critic.parameters()} == {id(p) for p in critic.head.parameters()}
    rows = agent.encode_prompts(["hi", "longer prompt"])
    batch = build_batch(rows, [[5, 6, 7], [8]], agent.pad_token_id)
    with critic.capture() as captured:
        sequence_logprobs(agent.model, batch)
    values = captured.values(torch.tensor([len(r) - 1 for r in rows]))
    torch.testing.assert_close(values.detach(), critic.values(rows, agent.pad_token_id))


def test_a_base_model_without_lm_head_can_be_a_critic(tmp_path) -> None:
    from transformers import LlamaModel

    base = LlamaModel(tiny_model(VOCAB).config)
    values = ValueModel(base).values([[1, 2, 3], [4]], pad_id=2)
    assert values.shape == (2,) and torch.isfinite(values).all()
    critic = ValueModel(tiny_model(VOCAB, seed=4), head_hidden_dim=8)
    critic.save(tmp_path / "critic")
    loaded = ValueModel.from_pretrained(tmp_path / "critic")
    torch.testing.assert_close(loaded.values([[1, 2, 3]], 2), critic.values([[1, 2, 3]], 2))


# -------------------------------------------------------------------------- trainer helpers
def length_task(num_items: int = 2) -> dict:
    data = length_ratio_dataset().select(range(num_items))
    return {
        "train_dataset": data,
        "formatters": [brief_formatter, detailed_formatter],
        "reward_func": length_ratio_reward,
    }


def feedback_task(num_items: int = 2) -> dict:
    return {
        "train_dataset": feedback_dataset().select(range(num_items)),
        "reward_func": feedback_ratio_reward,
        "external_transition": length_feedback,
    }


def build(cls, config, task: dict, critics: int | None = None, **kwargs):
    tokenizer = tiny_tokenizer()
    agents = [tiny_model(VOCAB, seed=i, eos_bias=4.0) for i in range(2)]
    if critics:
        kwargs["critics"] = [tiny_model(VOCAB, seed=10 + i) for i in range(critics)]
    return cls(agents=agents, tokenizer=tokenizer, args=config, **task, **kwargs)


def config(cls, tmp_path, **overrides):
    fields = {
        "max_new_tokens": 6,
        "rollout_buffer_size": 2,
        "eval_interval": 0,
        "agent_learning_rate": 1e-3,
        "output_dir": str(tmp_path / "run"),
        "early_termination_threshold": None,
    }
    return cls(**{**fields, **overrides})


def snapshot(modules) -> list[torch.Tensor]:
    return [p.detach().clone() for m in modules for p in m.parameters()]


def all_changed(before, modules) -> bool:
    after = [p for m in modules for p in m.parameters()]
    return len(before) == len(after) and all(
        not torch.equal(b, a) for b, a in zip(before, after, strict=True)
    )


def logged(trainer) -> dict[str, float]:
    merged: dict[str, float] = {}
    for _, entry in trainer.logger.history:
        merged.update(entry)
    return merged


# --------------------------------------------------------------------------- training smoke
@pytest.mark.parametrize("separate", [True, False])
def test_iac_trains_actors_and_critics(tmp_path, separate: bool) -> None:
    cfg = config(IACConfig, tmp_path, num_turns=2, use_separate_critic=separate)
    trainer = build(IACTrainer, cfg, feedback_task(), critics=2 if separate else None)
    actors = [a.model for a in trainer.agents]
    critic_parts = ([c.trunk for c in trainer.critics] if separate else []) + [
        c.head for c in trainer.critics
    ]
    actors_before, critics_before = snapshot(actors), snapshot(critic_parts)
    trainer.train()
    assert all_changed(actors_before, actors)
    assert all_changed(critics_before, critic_parts)
    assert len(trainer.critic_optimizers) == (2 if separate else 0)
    metrics = logged(trainer)
    for key in (
        "agent_0/policy_loss",
        "agent_1/value_loss",
        "value_mean",
        "turn_1/reward_mean",
        "turn_2/expected_return",
        "agent_1/grad_norm",
    ):
        assert math.isfinite(metrics[key]), key
    assert ("agent_1/critic_grad_norm" in metrics) == separate
    trainer.save_model(tmp_path / "saved")
    head = tmp_path / "saved" / "critic" / "agent_1"
    assert (head / "value_head.pt").is_file()
    assert (head / "config.json").is_file() == separate
    assert (tmp_path / "saved" / "agent_0" / "config.json").is_file()


def test_maac_critic_reads_the_joint_transcript_and_steps_once_per_round(
    tmp_path, monkeypatch
) -> None:
    trainer = build(MAACTrainer, config(MAACConfig, tmp_path), length_task(4), critics=1)
    texts: list[str] = []
    encoder = trainer.critic_encoders[0]
    encode = encoder.encode_prompts
    monkeypatch.setattr(encoder, "encode_prompts", lambda t: texts.extend(t) or encode(t))
    steps = {"critic": 0, "actor": 0}
    for name, opt in (("critic", trainer.critic_optimizers[0]), ("actor", trainer.optimizers[0])):
        monkeypatch.setattr(
            opt,
            "step",
            lambda *a, _o=opt.step, _n=name, **k: (
                steps.__setitem__(_n, steps[_n] + 1),
                _o(*a, **k),
            )[1],
        )
    actors, critic = [a.model for a in trainer.agents], [trainer.critics[0].trunk]
    before_actors, before_critic = snapshot(actors), snapshot(critic)
    trainer.train()
    assert steps == {"critic": 2, "actor": 2}  # 4 items, 2 per round: 2 rounds, 2 agents
    assert len(trainer.critics) == 1 and len(texts) == 4
    for text, item in zip(texts, length_ratio_dataset().select(range(4)), strict=True):
        assert "[agent_0 turn 1 prompt]" in text and "[agent_1 turn 1 prompt]" in text
        assert brief_formatter(item) in text and detailed_formatter(item) in text
    assert all_changed(before_actors, actors) and all_changed(before_critic, critic)
    metrics = logged(trainer)
    assert {"critic/value_loss", "agent_0/policy_loss", "agent_1/policy_loss"} <= set(metrics)
    assert not any(k.startswith("agent_") and "value_loss" in k for k in metrics)


def test_maac_transcript_of_turn_two_holds_both_answers(tmp_path, monkeypatch) -> None:
    trainer = build(
        MAACTrainer, config(MAACConfig, tmp_path, num_turns=2), feedback_task(1), critics=1
    )
    texts: list[str] = []
    encode = trainer.critic_encoders[0].encode_prompts
    monkeypatch.setattr(
        trainer.critic_encoders[0], "encode_prompts", lambda t: texts.extend(t) or encode(t)
    )
    rollouts: list[RolloutSample] = []
    trainer.metrics_callback = lambda r: rollouts.extend(r) or {}
    trainer.train()
    second = texts[1]
    for agent in (0, 1):
        answer = next(s.completion for s in rollouts if s.agent_idx == agent and s.turn == 1)
        assert f"[agent_{agent} turn 1 response]\n{answer}" in second
        assert f"[agent_{agent} turn 2 prompt]" in second


@pytest.mark.parametrize(
    ("cls", "cfg_cls", "critics"), [(MAACTrainer, MAACConfig, 1), (IACTrainer, IACConfig, None)]
)
def test_chunked_forwards_give_the_same_gradients(tmp_path, cls, cfg_cls, critics) -> None:
    # Gradients, not weights: Adam amplifies float noise in near-zero gradients.
    fields = {} if critics else {"use_separate_critic": False}
    grads, rollouts = [], None
    for size in (None, 1):
        cfg = config(
            cfg_cls,
            tmp_path,
            ppo_clip_range=0.2,
            value_clip_range=0.5,
            forward_batch_size=size,
            seed=0,  # the value heads are drawn from the seeded generator: equal in both runs
            **fields,
        )
        trainer = build(cls, cfg, length_task(2), critics=critics)
        if rollouts is None:
            items = [(dict(row), i) for i, row in enumerate(length_task(2)["train_dataset"])]
            tree = collect_tree(
                trainer.env, trainer.agents, items, num_generations=1, sampling=trainer.sampling
            )
            rollouts = trainer.learner.batch(tree)
        # Record the gradients each optimizer would apply (the step frees them afterwards).
        seen: list[torch.Tensor] = []
        for optimizer in trainer.optimizers[:1] + trainer.critic_optimizers:
            optimizer.step = functools.partial(_record_grads, optimizer, seen)
        for optimizer in trainer.optimizers[1:]:
            optimizer.step = lambda *args, **kwargs: None
        metrics = trainer.learner.update(rollouts)
        grads.append(seen)
        assert math.isfinite(metrics["agent_0/policy_loss"])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def _record_grads(optimizer: torch.optim.Optimizer, seen: list[torch.Tensor]) -> None:
    seen.extend(
        p.grad.clone() for g in optimizer.param_groups for p in g["params"] if p.grad is not None
    )


# ----------------------------------------------------------------------- metrics_callback
def test_metrics_callback_in_training_and_evaluation(tmp_path) -> None:
    seen: list[list[RolloutSample]] = []

    def callback(rollouts):
        seen.append(rollouts)
        return {"samples": len(rollouts), "item": rollouts[0].metadata["item_index"]}

    trainer = build(
        IACTrainer,
        config(IACConfig, tmp_path, use_separate_critic=False),
        length_task(2),
        metrics_callback=callback,
        eval_dataset=length_ratio_dataset().select(range(2)),
    )
    trainer.train()
    train_rollouts = seen[-1]
    assert len(train_rollouts) == 4  # 2 items x 2 agents, one round
    sample = train_rollouts[0]
    assert {"agent_idx", "prompt", "completion", "metadata"} <= {
        name for name in dir(sample) if not name.startswith("_")
    }
    assert set(sample.metadata) == {
        "turn",
        "generation",
        "item",
        "item_index",
        "reward",
        "return",
        "value",
        "advantage",
        "normalized_advantage",
    }
    assert sample.metadata["normalized_advantage"] is not None
    assert logged(trainer)["samples"] == 4

    seen.clear()
    metrics = trainer.evaluate()
    assert [len(r) for r in seen] == [2, 2]  # once per evaluated item, both agents' answers
    assert seen[0][0].metadata["normalized_advantage"] is None
    assert metrics["eval/samples"] == 2 and metrics["eval/item"] == 0.5  # mean over items
    assert "eval/turn_1/reward_mean" in metrics
    saved = json.loads((tmp_path / "run" / "eval-metrics.json").read_text())
    assert saved["eval/item"] == 0.5


def test_metrics_callback_may_not_shadow_trainer_metrics(tmp_path) -> None:
    trainer = build(
        IACTrainer,
        config(IACConfig, tmp_path, use_separate_critic=False),
        length_task(2),
        metrics_callback=lambda r: {"value_mean": 1.0},
    )
    with pytest.raises(ValueError, match="value_mean"):
        trainer.train()


# --------------------------------------------------------------------------- evaluate(), args
def test_evaluate_takes_no_argument_and_is_empty_without_eval_set(tmp_path) -> None:
    assert list(inspect.signature(IACTrainer.evaluate).parameters) == ["self"]
    assert list(inspect.signature(MAACTrainer.evaluate).parameters) == ["self"]
    trainer = build(MAACTrainer, config(MAACConfig, tmp_path), length_task(2), critics=1)
    assert trainer.evaluate() == {}
    with pytest.raises(TypeError):
        trainer.evaluate(2)


def test_eval_num_samples_set_on_args_limits_evaluation(tmp_path) -> None:
    trainer = build(
        MAACTrainer,
        config(MAACConfig, tmp_path),
        length_task(2),
        critics=1,
        eval_dataset=length_ratio_dataset(),
    )
    trainer.args.eval_num_samples = 3
    calls = []
    trainer.metrics_callback = lambda r: calls.append(r) or {}
    trainer.evaluate()
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("cls", "fields", "message"),
    [
        (IACConfig, {"critic_type": "q"}, "critic_type='q' is not supported.*B14"),
        (MAACConfig, {"critic_type": "q"}, "biases the policy gradient"),
        (IACConfig, {"critic_type": "x"}, "critic_type must be one of"),
        (IACConfig, {"num_turns": 2, "num_generations": 2}, "num_generations=2 with num_turns=2"),
        (MAACConfig, {"ppo_epochs": 2}, "ppo_epochs=2 needs ppo_clip_range"),
        (IACConfig, {"train_batch_size": 9}, "train_batch_size=9 is larger"),
        (IACConfig, {"rollout_buffer_size": 1}, "advantage_normalization=True"),
        (IACConfig, {"gae_lambda": 1.5}, "gae_lambda must be <= 1"),
        (MAACConfig, {"value_clip_range": 0.0}, "value_clip_range must be > 0"),
        (MAACConfig, {"ppo_clip_range": -0.1}, "ppo_clip_range must be > 0"),
        (MAACConfig, {"critic_learning_rate": 0}, "critic_learning_rate must be > 0"),
        (IACConfig, {"num_generations": 0}, "num_generations must be >= 1"),
        (IACConfig, {"use_separate_critic": "yes"}, "use_separate_critic must be True or False"),
    ],
)
def test_bad_configs_are_rejected(cls, fields, message) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        cls(**fields)


def test_bad_assignment_is_rejected_and_undone() -> None:
    cfg = MAACConfig()
    with pytest.raises(ValueError, match="ppo_epochs=3 needs ppo_clip_range"):
        cfg.ppo_epochs = 3
    assert cfg.ppo_epochs == 1 and cfg.critic_lr == cfg.agent_learning_rate


def test_defaults_are_cpu_friendly() -> None:
    cfg = IACConfig()
    fields = (cfg.num_turns, cfg.num_generations, cfg.num_train_epochs, cfg.ppo_epochs)
    assert fields == (None, 1, 1, 1)  # None: the task's turns
    assert cfg.task_settings() == {"num_turns": 1, "early_termination_threshold": -0.2}
    assert cfg.ppo_clip_range is None and cfg.use_separate_critic


def test_missing_or_extra_critics_are_rejected(tmp_path) -> None:
    task = length_task(2)
    with pytest.raises(ValueError, match="use_separate_critic=True needs critic_model"):
        build(IACTrainer, config(IACConfig, tmp_path), task)
    with pytest.raises(ValueError, match="would be unused"):
        build(IACTrainer, config(IACConfig, tmp_path, use_separate_critic=False), task, critics=2)
    with pytest.raises(ValueError, match="needs its centralised critic"):
        build(MAACTrainer, config(MAACConfig, tmp_path), task)
    with pytest.raises(ValueError, match="critics has 2 model"):
        build(MAACTrainer, config(MAACConfig, tmp_path), task, critics=2)
    with pytest.raises(TypeError, match="args must be a MAACConfig"):
        build(MAACTrainer, IACConfig(), task, critics=1)


def test_seed_dataset_rows_reach_reward_through_env(tmp_path) -> None:
    rows = []

    def reward(a, b, *, batch_items):
        rows.append(batch_items[0]["prompt"])
        return [1.0] * len(a)

    data = Dataset.from_dict({"prompt": ["x", "y"]})
    trainer = build(
        MAACTrainer,
        config(MAACConfig, tmp_path, advantage_normalization=False),
        {"train_dataset": data, "reward_func": reward},
        critics=1,
    )
    trainer.train()
    assert rows == ["x", "y"]
    assert "explained_variance" not in logged(trainer)  # constant returns: undefined, not NaN


@pytest.mark.parametrize("separate", [True, False])
def test_checkpoints_hold_critics_and_their_optimizers(tmp_path, separate: bool) -> None:
    cfg = config(IACConfig, tmp_path, use_separate_critic=separate)
    trainer = build(IACTrainer, cfg, length_task(2), critics=2 if separate else None)
    trainer.train()
    path = trainer.save_checkpoint()
    fresh = build(
        IACTrainer,
        config(IACConfig, tmp_path, use_separate_critic=separate),
        length_task(2),
        critics=2 if separate else None,
    )
    fresh.load_checkpoint(path)
    for old, new in zip(trainer.critics, fresh.critics, strict=True):
        for a, b in zip(old.state_dict().values(), new.state_dict().values(), strict=True):
            torch.testing.assert_close(a, b)
    for old, new in zip(
        trainer.critic_optimizers + trainer.optimizers,
        fresh.critic_optimizers + fresh.optimizers,
        strict=True,
    ):
        assert old.state_dict()["state"].keys() == new.state_dict()["state"].keys()
        assert new.state_dict()["state"]  # Adam moments restored, not a fresh optimizer


def test_example_runs_on_tiny_models(tmp_path) -> None:
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "actor_critic.py"
    command = [
        sys.executable,
        str(script),
        "--tiny",
        "--epochs",
        "1",
        "--items",
        "2",
        "--eval-repeats",
        "1",
        "--max-new-tokens",
        "4",
        "--output-dir",
        str(tmp_path),
        "--algo",
        "all",
    ]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for algo in ("IAC", "MAAC", "MAGRPO"):
        assert f"{algo} eval/turn_1/reward_mean: before" in proc.stdout
        assert f"{algo} trained 1 epoch(s) on 2 items in" in proc.stdout
    assert (tmp_path / "maac" / "metrics.jsonl").is_file()


def test_models_that_two_optimizers_would_step_are_refused(tmp_path) -> None:
    # One model object for two agents, one critic for two critics, or an agent's model as its
    # "separate" critic: two AdamW steps a round on one weight, each with its own moments.
    tokenizer, model = tiny_tokenizer(), tiny_model(VOCAB, seed=0)
    shared = "the optimizers agent_0 and agent_1 both train a parameter"
    with pytest.raises(ValueError, match=shared):
        MAGRPOTrainer(
            agents=[model, model], tokenizer=tokenizer, args=config(MAGRPOConfig, tmp_path),
            **length_task(),
        )  # fmt: skip
    agents = [tiny_model(VOCAB, seed=i) for i in range(2)]
    critic = tiny_model(VOCAB, seed=10)
    for critics, message in (
        ([critic, critic], "critic_0 and critic_1 both train"),
        (agents, "agent_0 and critic_0 both train"),
    ):
        with pytest.raises(ValueError, match=message):
            IACTrainer(
                agents=agents, tokenizer=tokenizer, critics=critics,
                args=config(IACConfig, tmp_path), **length_task(),
            )  # fmt: skip
