"""MAGRPOTrainer on tiny offline models: learning happens, metrics are right, invariants hold."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re

import pytest
import torch
from datasets import Dataset

from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer, MARLOOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig, MARLOOConfig
from cmlrl_agents.functional.advantages import group_advantages
from cmlrl_agents.learning.batch import PolicyRow, TrainBatch
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_tokenizer
from cmlrl_env import CoMLRLEnv, tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]


def make_trainer(tmp_path, **config):
    """Two tiny agents on the length-ratio task (``num_agents=1``: one agent, one formatter;
    ``num_turns=2`` adds the task's feedback transition)."""
    train, evaluation = tasks.length_ratio_splits()
    n = config.get("num_agents", 2)
    turns = {"external_transition": tasks.length_feedback} if config.get("num_turns", 1) > 1 else {}
    defaults = dict(
        num_agents=2,
        rollout_buffer_size=2,
        num_generations=2,
        max_new_tokens=6,
        eval_interval=4,
        eval_num_samples=2,
        logging_steps=1,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    args = MAGRPOConfig(**{**defaults, **config})
    return MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)][:n],
        formatters=FORMATTERS[:n],
        reward_func=tasks.length_ratio_reward if n == 2 else lambda c: [1.0] * len(c),
        train_dataset=train,
        eval_dataset=evaluation,
        args=args,
        **turns,
    )


def read_metrics(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_one_epoch_changes_every_parameter_and_logs_the_documented_keys(tmp_path):
    trainer = make_trainer(tmp_path)
    before = [copy.deepcopy(a.model.state_dict()) for a in trainer.agents]
    trainer.train()
    for agent, old in zip(trainer.agents, before, strict=True):
        for name, param in agent.model.named_parameters():
            assert not torch.equal(param.detach(), old[name]), f"{name} did not change"
    rows = read_metrics(tmp_path / "run")
    train_rows = [r for r in rows if "turn_1/reward_mean" in r]
    eval_rows = [r for r in rows if "eval/turn_1/reward_mean" in r]
    # 8 items, rollout_buffer_size 2, G=2: env_step grows by 4 per round
    assert [r["env_step"] for r in train_rows] == [4, 8, 12, 16]
    # evaluations before item 0 and item 4 of the epoch, counted in task items
    assert [r["env_step"] for r in eval_rows] == [0, 8]
    for key in (
        "turn_1/expected_return",
        "loss",
        "grad_norm",
        "agent_0/loss",
        "agent_1/grad_norm",
        "agent_1/turn_1/expected_return",
    ):
        assert all(math.isfinite(r[key]) for r in train_rows), key
    assert "eval/turn_1/expected_return" in eval_rows[0]
    assert json.loads((tmp_path / "run" / "eval-metrics.json").read_text())["env_step"] == 8


def test_logging_steps_averages_the_entries_in_each_gap(tmp_path):
    trainer = make_trainer(tmp_path, logging_steps=8, eval_interval=0)
    seen = []
    original = trainer.logger.log_train

    def spy(metrics, env_step):
        seen.append(metrics["turn_1/reward_mean"])
        return original(metrics, env_step)

    trainer.logger.log_train = spy
    trainer.train()
    rows = read_metrics(tmp_path / "run")
    assert [r["env_step"] for r in rows] == [8, 16]
    assert rows[0]["turn_1/reward_mean"] == pytest.approx((seen[0] + seen[1]) / 2)
    assert rows[1]["turn_1/reward_mean"] == pytest.approx((seen[2] + seen[3]) / 2)


def row(slot: int, turn: int, prompt: tuple[int, ...], completion: tuple[int, ...], adv: float):
    return PolicyRow(
        agent=0,
        item_slot=slot,
        turn=turn,
        prompt_ids=prompt,
        completion_ids=completion,
        advantage=adv,
    )


def test_single_agent_update_is_grpo(tmp_path):
    """1 agent: the trainer's step equals GRPO written out by hand on the same completions,
    log-probs at the sampling temperature."""
    data = Dataset.from_dict({"prompt": ["a b", "c"]})
    reward = lambda c: [float(len(x)) for x in c]  # noqa: E731
    agent = tiny_agent(seed=3)
    reference = copy.deepcopy(agent.model)
    args = MAGRPOConfig(
        num_generations=3,
        max_new_tokens=5,
        eval_interval=0,
        rollout_buffer_size=2,
        max_grad_norm=None,
        agent_learning_rate=1e-2,
        temperature=0.7,
        output_dir=str(tmp_path / "run"),
        seed=0,
    )
    trainer = MAGRPOTrainer(agents=[agent], reward_func=reward, train_dataset=data, args=args)
    recorded = {}
    original = trainer.learner.update
    optimizer = trainer.learner.optimizers[0]
    original_step = optimizer.step

    def record(batch):
        recorded["rows"] = batch.rows
        return original(batch)

    def record_step(*args, **kwargs):  # the gradient the step applies (no clipping here)
        recorded["grads"] = [p.grad.clone() for p in agent.model.parameters()]
        return original_step(*args, **kwargs)

    trainer.learner.update = record
    optimizer.step = record_step
    trainer.train()
    rows = recorded["rows"]
    # GRPO: A = (r - mean_group) / (std_group + eps); loss = mean_i -A_i * sum_t log p_T(token)
    rewards = torch.tensor(
        [
            float(len(agent.tokenizer.decode(r.completion_ids, skip_special_tokens=True)))
            for r in rows
        ]
    ).reshape(2, 3)
    expected_adv = group_advantages(rewards, "mean", True).reshape(-1)
    torch.testing.assert_close(torch.tensor([r.advantage for r in rows]), expected_adv)
    loss = 0.0
    for r, adv in zip(rows, expected_adv, strict=True):
        ids = torch.tensor([list(r.prompt_ids) + list(r.completion_ids)])
        logits = (reference(input_ids=ids).logits[0, :-1] / 0.7).log_softmax(-1)
        targets = ids[0, 1:]
        token_lp = logits.gather(-1, targets[:, None])[:, 0][len(r.prompt_ids) - 1 :]
        loss = loss - adv * token_lp.sum() / len(rows)
    loss.backward()
    # The gradients are compared, not the weights after AdamW: Adam moves every weight by about
    # the learning rate whatever its gradient's size, so on a near-zero gradient the float noise
    # between the batched and the one-by-one forward would flip the sign of a 1e-2 step.
    names = [name for name, _ in agent.model.named_parameters()]
    for name, got, want in zip(names, recorded["grads"], reference.parameters(), strict=True):
        torch.testing.assert_close(got, want.grad, atol=1e-6, rtol=1e-4, msg=name)
    assert any(g.abs().max() > 1e-3 for g in recorded["grads"])  # a real step, not a zero one
    pairs = zip(agent.model.parameters(), reference.parameters(), strict=True)
    assert any(not torch.equal(p, q) for p, q in pairs)  # and the optimizer applied it


def record_step_gradients(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The gradients ``optimizer``'s next step applies, filled in when it steps."""
    grads: list[torch.Tensor] = []
    original = optimizer.step

    def step(*args, **kwargs):
        params = [p for group in optimizer.param_groups for p in group["params"]]
        grads.extend(p.grad.clone() for p in params)
        return original(*args, **kwargs)

    optimizer.step = step
    return grads


def one_agent_batch(learner, rows: list[PolicyRow]) -> TrainBatch:
    return TrainBatch(tuple(rows), learner.windows(len({r.item_slot for r in rows})))


@pytest.mark.parametrize("aggregation", ["sequence_sum", "token_mean", "sequence_mean"])
def test_forward_chunks_give_the_same_update_as_one_batch(tmp_path, aggregation):
    prompts = [(1, 5, 9), (1, 7), (2, 3, 4, 5)]
    rows = [
        row(i % 2, 1, prompts[i % 3], tuple(range(10, 13 + i)), adv)
        for i, adv in enumerate([0.5, -1.0, 2.0, 0.1, -0.3])
    ]
    results = []
    for chunk in (None, 1, 2):
        trainer = make_trainer(
            tmp_path, num_agents=1, forward_batch_size=chunk, loss_aggregation=aggregation
        )
        grads = record_step_gradients(trainer.learner.optimizers[0])
        stats = trainer.learner.update(one_agent_batch(trainer.learner, rows))
        results.append((stats["loss"], grads))
    # The gradients each step applies are compared: Adam scales a near-zero gradient's float
    # noise up to a step of about the learning rate.
    for loss, grads in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-5)
        for got, want in zip(grads, results[0][1], strict=True):
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_reference_kl_metrics(tmp_path):
    trainer = make_trainer(
        tmp_path, reference_kl_enabled=True, reference_kl_coef=0.5, eval_interval=0
    )
    trainer.train()
    rows = read_metrics(tmp_path / "run")
    assert rows[0]["turn_1/reference_kl_mean"] == pytest.approx(0.0, abs=1e-6)  # policy == ref
    assert rows[-1]["turn_1/reference_kl_mean"] > 0.0
    assert rows[-1]["turn_1/reference_kl_penalty_mean"] == pytest.approx(
        0.5 * rows[-1]["turn_1/reference_kl_mean"]
    )


def test_agents_from_the_same_weights_share_one_frozen_reference():
    from cmlrl_agents.policies.reference import reference_policies

    same = [tiny_agent(seed=0), tiny_agent(seed=0), tiny_agent(seed=1)]
    refs = reference_policies(same, None)
    assert refs[0] is refs[1] and refs[2] is not refs[0]
    for agent, ref in zip(same, refs, strict=True):
        assert ref is not agent.model and not any(p.requires_grad for p in ref.parameters())
        for a, b in zip(agent.model.parameters(), ref.parameters(), strict=True):
            assert torch.equal(a, b)
    with torch.no_grad():  # one weight apart: a copy of its own
        next(same[1].model.parameters()).add_(1e-3)
    refs = reference_policies(same, None)
    assert len({id(r) for r in refs}) == 3


def test_forward_chunks_give_the_same_reference_kl_stats(tmp_path):
    rows = [row(i // 2, 1 + i % 2, (1, 5, 9), tuple(range(10, 13 + i)), 0.5 - i) for i in range(4)]
    stats = []
    for chunk in (None, 1, 3):
        trainer = make_trainer(
            tmp_path,
            num_agents=1,
            num_turns=2,
            forward_batch_size=chunk,
            reference_kl_enabled=True,
        )
        with torch.no_grad():  # move the policy away from its reference
            next(trainer.agents[0].model.parameters()).add_(0.05)
        stats.append(trainer.learner.update(one_agent_batch(trainer.learner, rows)))
    assert stats[0]["turn_2/reference_kl_mean"] > 0.0
    for got in stats[1:]:
        for key in ("loss", "turn_1/reference_kl_mean", "turn_2/reference_kl_mean"):
            assert got[key] == pytest.approx(stats[0][key], rel=1e-5), key


def test_evaluate_uses_one_response_per_agent_per_turn_in_batches(tmp_path):
    trainer = make_trainer(tmp_path, eval_batch_size=2)
    calls = []
    for agent in trainer.agents:
        original = agent.generate

        def spy(prompts, num_samples=1, sampling=None, keys=None, _original=original):
            calls.append((len(prompts), num_samples))
            return _original(prompts, num_samples, sampling, keys)

        agent.generate = spy
    metrics = trainer.evaluate(num_eval_samples=2)
    assert calls == [(2, 1), (2, 1)]
    assert set(metrics) == {
        "eval/turn_1/reward_mean",
        "eval/turn_1/expected_return",
        "eval/turn_1/reward_sem",
    }
    calls.clear()
    trainer.args.eval_batch_size = 1
    trainer.evaluate(num_eval_samples=1)
    assert calls == [(1, 1), (1, 1)]


def test_evaluate_without_eval_dataset_returns_empty(tmp_path):
    train, _ = tasks.length_ratio_splits()
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(), tiny_agent()],
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=train,
        args=MAGRPOConfig(output_dir=str(tmp_path / "r")),
    )
    assert trainer.evaluate() == {}


def test_eval_logger_and_aggregator_get_agent_item_turn_completions(tmp_path):
    seen = {}

    def eval_logger(*, agent_completions_turns, batch_items, prompts):
        seen.update(completions=agent_completions_turns, items=batch_items, prompts=prompts)
        return [
            {"turn_1/response_chars": float(len(agent_completions_turns[0][row][0]))}
            for row in range(len(batch_items))
        ]

    def eval_aggregator(rows, *, num_turns):
        return {"turn_1/response_chars": sum(r["turn_1/response_chars"] for r in rows) / len(rows)}

    trainer = make_trainer(tmp_path)
    trainer.eval_logger, trainer.eval_aggregator = eval_logger, eval_aggregator
    metrics = trainer.evaluate(num_eval_samples=2)
    assert len(seen["completions"]) == 2 and len(seen["completions"][0]) == 2
    assert all(len(turns) == 1 for agent in seen["completions"] for turns in agent)
    assert seen["prompts"] == [item["prompt"] for item in seen["items"]]
    assert metrics["eval/turn_1/response_chars"] == pytest.approx(
        sum(len(c[0]) for c in seen["completions"][0]) / 2
    )


def test_trains_on_a_ready_env(tmp_path):
    train, _ = tasks.length_ratio_splits()
    env = CoMLRLEnv(train, FORMATTERS, tasks.length_ratio_reward)
    args = MAGRPOConfig(
        num_generations=2,
        max_new_tokens=4,
        eval_interval=0,
        output_dir=str(tmp_path / "r"),
        num_train_epochs=1,
    )
    trainer = MARLOOTrainer(
        agents=[tiny_agent(), tiny_agent(1)], env=env, args=MARLOOConfig(**{**args.to_dict()})
    )
    trainer.train()
    assert trainer.env_step == 16
    with pytest.raises(ValueError, match="env= already holds"):
        MAGRPOTrainer(
            agents=[tiny_agent(), tiny_agent()],
            env=env,
            reward_func=tasks.length_ratio_reward,
            args=args,
        )


def test_team_size_must_agree(tmp_path):
    train, _ = tasks.length_ratio_splits()
    with pytest.raises(ValueError, match=re.escape("num_agents=3, args.num_agents=2")):
        MAGRPOTrainer(
            agents=[tiny_agent(), tiny_agent()],
            num_agents=3,
            formatters=FORMATTERS,
            reward_func=tasks.length_ratio_reward,
            train_dataset=train,
            args=MAGRPOConfig(num_agents=2, output_dir=str(tmp_path)),
        )
    with pytest.raises(ValueError, match="model object, which needs a tokenizer"):
        MAGRPOTrainer(
            agents=[tiny_model(300), tiny_model(300)],
            formatters=FORMATTERS,
            reward_func=tasks.length_ratio_reward,
            train_dataset=train,
            args=MAGRPOConfig(output_dir=str(tmp_path)),
        )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "num_generations",
            1,
            "num_generations=1 with advantage_mode='mean': a group baseline "
            "needs at least 2 samples",
        ),
        ("joint_mode", "crossed", "joint_mode must be one of ['aligned', 'cross'], got 'crossed'"),
        ("advantage_mode", "median", "advantage_mode must be one of"),
        ("loss_aggregation", "mean", "loss_aggregation must be one of"),
        ("num_turns", 0, "num_turns must be >= 1, got 0"),
        ("discount", 1.5, "discount must be <= 1.0, got 1.5"),
        ("temperature", 0.0, "temperature must be > 0.0, got 0.0"),
        ("top_p", 0.0, "top_p must be > 0.0, got 0.0"),
        ("eval_num_samples", 0, "eval_num_samples must be >= 1, got 0"),
        ("eval_batch_size", 0, "eval_batch_size must be >= 1, got 0"),
        ("logging_steps", 0, "logging_steps must be >= 1, got 0"),
        ("agent_learning_rate", -1.0, "agent_learning_rate must be > 0.0, got -1.0"),
        ("reference_kl_coef", -0.1, "reference_kl_coef must be >= 0.0, got -0.1"),
        ("max_new_tokens", 2.5, "max_new_tokens must be an int, got 2.5"),
        (
            "advantage_normalization",
            "yes",
            "advantage_normalization must be True, False or one of ['group', 'batch', 'none'] "
            "(TRL's scale_rewards), got 'yes'",
        ),
    ],
)
def test_bad_config_values_are_rejected_on_construction_and_assignment(field, value, message):
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        MAGRPOConfig(**{field: value})
    config = MAGRPOConfig()
    before = getattr(config, field)
    with pytest.raises((TypeError, ValueError), match=re.escape(message)):
        setattr(config, field, value)
    assert getattr(config, field) == before  # a rejected assignment leaves the config valid


def test_config_rejects_unknown_fields_and_cross_field_rules():
    config = MAGRPOConfig()
    with pytest.raises(AttributeError, match="has no field 'eval_samples'"):
        config.eval_samples = 3
    with pytest.raises(ValueError, match="train_batch_size=8 is larger than rollout_buffer_size=2"):
        MAGRPOConfig(train_batch_size=8)
    config = MAGRPOConfig(num_generations=1, advantage_mode="raw", advantage_normalization=False)
    assert config.num_generations == 1
    assert (
        MAGRPOConfig(advantage_mode="raw", advantage_normalization="none").advantage_mode == "raw"
    )
    with pytest.raises(
        ValueError, match="advantage_mode='raw' with advantage_normalization='batch'"
    ):
        MAGRPOConfig(advantage_mode="raw", advantage_normalization="batch")


@pytest.fixture
def tiny_model_dir(tmp_path):
    """A tiny model and tokenizer saved as a local folder: what offline users pass by path."""
    tokenizer = tiny_tokenizer()
    folder = tmp_path / "tiny-model"
    tiny_model(len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_seed_000_program_runs_with_only_its_imports_changed(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the program writes runs/ and eval-metrics.json in the cwd
    # --- SPEC §5, verbatim but for the import lines and the model name (a local folder) ---
    import json
    import math
    from pathlib import Path

    from datasets import Dataset

    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer

    tasks_ds = Dataset.from_dict(
        {
            "prompt": list(tasks.LENGTH_RATIO_PROMPTS),
            "target_min": [2.0] * 10,
            "target_max": [3.0] * 10,
        }
    )
    split = tasks_ds.train_test_split(test_size=0.2, seed=42)
    train_dataset = split["train"]
    eval_dataset = split["test"]

    def brief_formatter(item):
        return f"Write a short response to this task:\n{item['prompt']}"

    def detailed_formatter(item):
        return f"Write a detailed response to this task:\n{item['prompt']}"

    formatters = [brief_formatter, detailed_formatter]

    def reward_func(brief_completions, detailed_completions, *, batch_items):
        item = batch_items[0]
        rewards = []
        for brief, detailed in zip(brief_completions, detailed_completions):  # noqa: B905
            if not brief:
                rewards.append(0.0)
                continue
            ratio = len(detailed) / len(brief)
            distance = max(item["target_min"] - ratio, ratio - item["target_max"], 0.0)
            rewards.append(math.exp(-distance))
        return rewards

    item = train_dataset[0]
    assert item["prompt"] in brief_formatter(item)
    assert reward_func(["Hi"], ["Hello"], batch_items=[item]) == [1.0]
    assert reward_func([""], ["Hello"], batch_items=[item]) == [0.0]

    config = MAGRPOConfig(
        num_agents=2,
        num_turns=1,
        num_train_epochs=1,
        num_generations=4,
        max_new_tokens=128,
        eval_interval=4,
        eval_num_samples=len(eval_dataset),
        eval_batch_size=1,
        logging_steps=4,
    )
    trainer = MAGRPOTrainer(
        agent_model=tiny_model_dir,
        num_agents=2,
        formatters=formatters,
        reward_func=reward_func,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        args=config,
    )
    trainer.train()
    metrics = trainer.evaluate(num_eval_samples=len(eval_dataset))
    Path("eval-metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    # --- end of the program ---
    assert set(metrics) == {
        "eval/turn_1/reward_mean",
        "eval/turn_1/expected_return",
        "eval/turn_1/reward_sem",
    }
    assert trainer.agents[0].model is not trainer.agents[1].model  # one copy per agent
    assert (tmp_path / "eval-metrics.json").exists()


def test_seed_002_program_runs_with_only_its_imports_changed(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # --- seed 002 (SPEC §6), verbatim but for the import lines and the model name ---
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer

    model_name = tiny_model_dir
    tokenizer = AutoTokenizer.from_pretrained(model_name)
    train_dataset = Dataset.from_dict(
        {
            "prompt": [
                "Describe a city in the clouds:",
                "Invent a new holiday and explain it:",
                "Write a bedtime story for a dragon:",
                "Design a playground on Mars:",
            ]
        }
    )

    def length_ratio_reward(completions1, completions2):
        rewards = []
        for first, second in zip(completions1, completions2):  # noqa: B905
            ratio = len(second) / max(len(first), 1)
            distance = 0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))
            rewards.append(math.exp(-distance))
        return rewards

    def length_feedback(prompt, agent_completions, num_agents, **history):
        lengths = [len(text) for text in agent_completions]
        ratio = lengths[1] / max(lengths[0], 1)
        return [
            f"{prompt}\n\nYour last answer had {lengths[i]} characters. "
            f"The second answer was {ratio:.1f} times as long as the first; "
            "the goal is 2 to 3 times. Please write an improved answer."
            for i in range(num_agents)
        ]

    config = MAGRPOConfig(
        num_turns=2,
        num_train_epochs=2,
        num_generations=4,
        max_new_tokens=64,
        logging_steps=1,
        early_termination_threshold=0.9,
    )
    trainer = MAGRPOTrainer(
        agents=[AutoModelForCausalLM.from_pretrained(model_name) for _ in range(2)],
        tokenizer=tokenizer,
        reward_func=length_ratio_reward,
        external_transition=length_feedback,
        train_dataset=train_dataset,
        args=config,
    )
    trainer.train()
    # --- end of the program ---
    keys = set().union(*(m for _, m in trainer.logger.history))
    assert {"turn_1/reward_mean", "turn_2/reward_mean", "turn_2/expected_return"} <= keys
    # up to 4 + 16 joint responses per item and epoch
    assert 8 * 4 <= trainer.env_step <= 8 * 20


def test_mask_truncated_completions_leaves_cut_answers_out_of_the_loss_not_the_groups(
    tmp_path,
) -> None:
    from cmlrl_agents.foundation.rollout import collect_tree

    trainer = make_trainer(tmp_path, max_new_tokens=3, num_generations=4)
    data = tasks.length_ratio_dataset()
    torch.manual_seed(0)
    tree = collect_tree(
        trainer.env,
        trainer.agents,
        [(data[i], i) for i in range(2)],
        num_generations=4,
        sampling=trainer.agent_sampling,
    )
    for level in tree.levels:  # the tiny model rarely ends: say sample 0 of each group did
        for samples in (s for agent in level.completions for s in agent):
            samples[0] = dataclasses.replace(samples[0], finished=True)
    every = trainer.learner.batch(tree).rows
    assert {r.finished for r in every} == {True, False}
    trainer.args.mask_truncated_completions = True
    kept = trainer.learner.batch(tree).rows
    # The finished rows, with the advantages they had among all their siblings.
    assert kept == tuple(r for r in every if r.finished)
    before = [p.detach().clone() for p in trainer.agents[0].model.parameters()]
    metrics = trainer.learner.update(trainer.learner.batch(tree))
    assert "agent_0/loss" in metrics
    after = trainer.agents[0].model.parameters()
    moved = any(not torch.equal(p, q) for p, q in zip(after, before, strict=True))
    assert moved == any(r.agent == 0 for r in kept)


def test_log_train_levels_logs_the_eval_loggers_values_of_each_rounds_answers(tmp_path) -> None:
    seen = []

    def logger(*, agent_completions_turns, batch_items, prompts=None):
        seen.append(agent_completions_turns)
        chains = list(zip(*agent_completions_turns, strict=True))  # per joint action
        return [
            {f"turn_{len(c[0])}/level/chars": float(len(c[0][-1]) + len(c[1][-1]))} for c in chains
        ]

    train, evaluation = tasks.length_ratio_splits()
    args = MAGRPOConfig(
        num_agents=2,
        num_turns=2,
        num_generations=2,
        max_new_tokens=4,
        eval_interval=0,
        log_train_levels=True,
        early_termination_threshold=None,  # every branch plays turn 2
        output_dir=str(tmp_path / "run"),
    )
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(seed=0), tiny_agent(seed=1)],
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        external_transition=tasks.length_feedback,
        train_dataset=train.select(range(2)),
        eval_dataset=evaluation,
        eval_logger=logger,
        eval_aggregator=lambda rows, num_turns: {},
        args=args,
    )
    trainer.train()
    # One call per level: 2 items x 2 joint actions at turn 1; each of the 4 goes on into 2.
    turn_1, turn_2 = seen
    assert [len(c) for c in turn_1[0]] == [1] * 4 and [len(c) for c in turn_2[0]] == [2] * 8
    for agent, parents in zip(turn_2, turn_1, strict=True):  # a turn-2 chain extends its parent
        assert [c[0] for c in agent] == [parents[k // 2][0] for k in range(8)]
    (row,) = [r for r in read_metrics(trainer.run_dir) if "turn_2/level/chars" in r]
    want = [len(a[-1]) + len(b[-1]) for a, b in zip(*turn_2, strict=True)]
    assert row["turn_2/level/chars"] == pytest.approx(sum(want) / len(want))
