"""Learning-signal defects of issue 9: early termination, precision, advantages, sampling."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from datasets import Dataset

from cmlrl_agents import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig, MAREINFORCEConfig
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.functional.advantages import group_advantages
from cmlrl_agents.functional.returns import tree_returns
from cmlrl_agents.learning.credit import agent_returns, agent_rows, joint_returns
from cmlrl_agents.policies import model_setup
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.scripted import ScriptedPolicy
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_tokenizer
from cmlrl_env import Task, tasks

SAMPLING = SamplingConfig(max_new_tokens=4)


def _path_policy() -> ScriptedPolicy:
    return ScriptedPolicy(lambda prompt, g: str(g) if prompt == "root" else f"{prompt}/{g}")


def _answer_is_next_prompt(prompt, agent_completions, num_agents, **history):
    return [agent_completions[0]] * num_agents


# ------------------------------------------------------- 1. early termination and success
def test_an_answer_that_reaches_the_target_gets_the_largest_advantage():
    # The example: turn-1 rewards [1.0, 0.5, 0.2, 0.0], threshold 0.9; each missed
    # answer k is followed by turn-2 rewards 0.6, 0.7, 0.8, 0.9 (mean 0.75).
    table = {"0": 1.0, "1": 0.5, "2": 0.2, "3": 0.0}
    table.update({f"{k}/{g}": 0.6 + 0.1 * g for k in (1, 2, 3) for g in range(4)})
    task = Task(
        None,
        lambda c1, c2: [table[a] for a in c1],
        num_agents=2,
        num_turns=2,
        external_transition=_answer_is_next_prompt,
        early_termination_threshold=0.9,
    )
    tree = collect_tree(
        task,
        [_path_policy(), _path_policy()],
        [({"prompt": "root"}, 0)],
        num_generations=4,
        sampling=SAMPLING,
    )
    assert [o.terminated for o in tree.levels[0].outcomes[0]] == [True, False, False, False]
    turn1, _ = joint_returns(tree, 1.0)
    # Before the fix: [1.0, 1.25, 0.95, 0.75] (the 0.5 answer ranked first). Now the answer
    # that ended its branch keeps its reward for the turn it did not play: 1.0 + 1.0.
    torch.testing.assert_close(turn1, torch.tensor([[2.0, 1.25, 0.95, 0.75]]))
    samples = agent_rows(tree, 0, agent_returns(tree, joint_returns(tree, 1.0)), "mean", "group")
    first = [s.advantage for s in samples if s.turn == 1]
    # R - mean(R) = [0.7625, 0.0125, -0.2875, -0.4875]; std_pop = sqrt(0.22546875)
    std = 0.22546875**0.5
    expected = [0.7625 / std, 0.0125 / std, -0.2875 / std, -0.4875 / std]
    assert first == pytest.approx(expected, abs=1e-5)
    assert first == sorted(first, reverse=True)  # credit follows the turn-1 reward


def test_success_is_never_credited_below_a_sibling_that_missed():
    # Property over random trees: with the sibling's later rewards no higher than the hit
    # answer's reward ("all else equal"), the hit answer's return is the larger one.
    rng = random.Random(0)
    for _ in range(200):
        turns, discount, threshold = rng.randint(2, 4), rng.choice([0.5, 0.9, 1.0]), 0.7
        hit = rng.uniform(threshold + 1e-3, 1.0)
        miss = rng.uniform(0.0, threshold)
        rewards, parents, left = [torch.tensor([hit, miss])], [torch.tensor([-1])], []
        left.append(torch.tensor([turns - 1, 0]))
        parent = 1  # the missed branch continues as one chain of 2 children per turn
        for _ in range(1, turns):
            later = [rng.uniform(0.0, hit), rng.uniform(0.0, hit)]
            rewards.append(torch.tensor(later))
            parents.append(torch.tensor([parent, parent]))
            left.append(torch.zeros(2, dtype=torch.long))
            parent = 0
        returns = tree_returns(rewards, parents, discount, left)
        assert float(returns[0][0]) >= float(returns[0][1])


def test_tree_returns_hold_an_ended_branch_reward_by_hand():
    # Level 0: [0.8 (ended, 2 turns left), 0.1]; level 1: two children of node 1, one ended
    # with 1 turn left (0.9); level 2: one child of level-1 node 0 (0.3).
    rewards = [torch.tensor([0.8, 0.1]), torch.tensor([0.2, 0.9]), torch.tensor([0.3])]
    parents = [torch.tensor([-1]), torch.tensor([1, 1]), torch.tensor([0])]
    left = [torch.tensor([2, 0]), torch.tensor([0, 1]), torch.tensor([0])]
    r0, r1, r2 = tree_returns(rewards, parents, 0.5, left)
    torch.testing.assert_close(r2, torch.tensor([0.3]))
    # 0.2 + 0.5 * 0.3 = 0.35; 0.9 * (1 + 0.5) = 1.35
    torch.testing.assert_close(r1, torch.tensor([0.35, 1.35]))
    # 0.8 * (1 + 0.5 + 0.25) = 1.4; 0.1 + 0.5 * (0.35 + 1.35) / 2 = 0.525
    torch.testing.assert_close(r0, torch.tensor([1.4, 0.525]))
    with pytest.raises(ValueError, match=r"turns_left\[0\] is > 0 for a joint action that has"):
        tree_returns(rewards, parents, 0.5, [torch.tensor([2, 1]), left[1], left[2]])
    with pytest.raises(ValueError, match=r"turns_left\[1\] must be a long tensor of shape"):
        tree_returns(rewards, parents, 0.5, [left[0], torch.tensor([0.0, 1.0]), left[2]])


# ------------------------------------------------------------- 3. no advantage blow-up
def test_raw_returns_are_never_divided_by_their_std():
    with pytest.raises(ValueError, match=r"advantage_mode='raw' with advantage_normalization=True"):
        MAGRPOConfig(advantage_mode="raw")
    config = MAGRPOConfig(advantage_normalization=False)
    with pytest.raises(ValueError, match="Set advantage_normalization=False"):
        MAGRPOConfig(advantage_mode="raw", advantage_normalization=True)
    config.advantage_mode = "raw"  # allowed once normalisation is off
    with pytest.raises(ValueError, match="advantage_normalization=True"):
        config.advantage_normalization = True
    assert config.advantage_normalization is False
    with pytest.raises(ValueError, match="baseline 'raw' with normalize_std=True"):
        group_advantages(torch.tensor([[0.7, 0.7]]), "raw", normalize_std=True)


def test_the_g1_hint_leads_to_a_working_config():
    with pytest.raises(ValueError) as info:
        MAGRPOConfig(num_generations=1)
    message = str(info.value)
    assert "advantage_mode='raw' with advantage_normalization=False" in message
    # Following the hint: plain REINFORCE; equal returns stay what they are.
    config = MAGRPOConfig(num_generations=1, advantage_mode="raw", advantage_normalization=False)
    adv = group_advantages(
        torch.tensor([[0.7], [0.7]]), config.advantage_mode, config.advantage_normalization
    )
    torch.testing.assert_close(adv, torch.tensor([[0.7], [0.7]]))
    assert MAREINFORCEConfig(num_generations=1).num_generations == 1


# ------------------------------------------------------ 2. low-precision weights train
def test_a_bf16_checkpoint_trains_with_fp32_master_weights(tmp_path):
    tokenizer = tiny_tokenizer()
    folder = tmp_path / "tiny-bf16"
    tiny_model(len(tokenizer)).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    train, _ = tasks.length_ratio_splits()
    args = MAGRPOConfig(
        num_agents=2,
        rollout_buffer_size=1,
        num_generations=2,
        max_new_tokens=6,
        eval_interval=0,
        agent_learning_rate=5e-6,  # comlrl's default: far below half a bf16 ulp of most weights
        output_dir=str(tmp_path / "run"),
        verbose=False,
    )
    trainer = MAGRPOTrainer(
        agent_model=str(folder),
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=train.select(range(3)),  # three optimizer steps per agent
        args=args,
    )
    agent = trainer.agents[0]
    assert agent.loaded_dtype == torch.bfloat16  # the folder holds bf16 weights ...
    assert {p.dtype for p in agent.model.parameters()} == {torch.float32}  # ... trained in fp32
    before = {k: v.clone() for k, v in agent.model.state_dict().items()}
    trainer.train()
    moved = total = 0
    for key, value in agent.model.state_dict().items():
        if "embed_tokens" in key:  # rows of bytes that never occur get no gradient
            continue
        moved += int((value != before[key]).sum())
        total += value.numel()
    # Every other weight has a gradient: in fp32 master weights each moves (a step of about
    # the learning rate); kept in bf16, almost none would (half a bf16 ulp is far larger).
    assert moved / total > 0.99


def test_a_lora_adapter_on_a_bf16_base_trains_in_fp32_and_the_base_stays_bf16():
    peft = pytest.importorskip("peft")
    tokenizer = tiny_tokenizer()
    base = tiny_model(len(tokenizer)).to(torch.bfloat16)
    config = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    model = peft.get_peft_model(base, config, autocast_adapter_dtype=False)  # bf16 adapters
    agent = LLMAgent(model, tokenizer)
    assert agent.loaded_dtype == torch.bfloat16
    dtypes = {(p.dtype, p.requires_grad) for p in model.parameters()}
    assert dtypes == {(torch.bfloat16, False), (torch.float32, True)}
    ((completion, _),) = agent.generate(["hi"], 2, SamplingConfig(max_new_tokens=4))
    agent.logprobs([completion.prompt_ids], [completion.completion_ids]).sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)


# --------------------------------------------------- 4. generation settings are ours alone
def test_the_checkpoints_generation_config_does_not_change_sampling():
    agent = tiny_agent(seed=0)
    only = 100
    config = agent.model.generation_config
    config.suppress_tokens = [i for i in range(len(agent.tokenizer)) if i != only]
    sampling = SamplingConfig(max_new_tokens=12, min_new_tokens=12)
    torch.manual_seed(0)
    ((completion,),) = agent.generate(["hello"], 1, sampling)
    assert set(completion.completion_ids) != {only}  # the model's suppress_tokens is ignored
    assert agent.model.generation_config is config  # and restored after the call
    assert config.suppress_tokens[0] == 0
    # The same generate call without the guard would have honoured it: every token is `only`.
    ids = torch.tensor([list(completion.prompt_ids)])
    out = agent.model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        pad_token_id=agent.pad_token_id,
        **sampling.generate_kwargs(),
    )
    assert set(out[0, ids.shape[1] :].tolist()) == {only}


# ------------------------------------------------------------- 8. no double chat template
def test_a_prompt_that_already_carries_the_template_is_used_as_it_is():
    agent = tiny_agent(seed=0)
    plain = "Describe a city in the clouds."
    templated = agent.tokenizer.apply_chat_template(
        [{"role": "user", "content": plain}], tokenize=False, add_generation_prompt=True
    )
    ids_plain, ids_templated = agent.encode_prompts([plain, templated])
    assert ids_templated == ids_plain
    text = agent.tokenizer.decode(ids_templated)
    assert text.count("<|im_start|>system") == 1 and text.count("<|im_start|>user") == 1
    assert agent.chat_format.is_templated("<|im_start|>user\nhi<|im_end|>\n")
    assert not agent.chat_format.is_templated("Describe <b>a</b> city.")


def test_the_applied_template_is_logged_once_with_how_to_turn_it_off(caplog, monkeypatch):
    model_setup._logged_formats.clear()
    monkeypatch.setattr(model_setup, "_warned_system_turn", False)
    with caplog.at_level(logging.INFO, logger="cmlrl_agents.policies.agent"):
        tiny_agent(seed=0)
        tiny_agent(seed=1)  # same template: not logged again
    records = [r for r in caplog.records if "chat template" in r.getMessage()]
    assert [r.levelno for r in records] == [logging.INFO, logging.WARNING]
    message = records[0].getMessage()  # the whole template, at INFO
    assert "<|im_start|>system\\nYou are tiny.<|im_end|>" in message
    assert "The template adds a system turn that no prompt asked for" in message
    assert "model_config={'chat_template': False}" in message
    # the system turn: one short warning per process
    assert records[1].getMessage() == (
        "The tokenizer's chat template adds a system turn to every prompt: "
        "'<|im_start|>system\\nYou are tiny.<|im_end|>\\n<|im_start|>user\\n'...; "
        "model_config={'system_prompt': ...} replaces it, {'chat_template': False} turns the "
        "template off."
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cmlrl_agents.policies.agent"):
        model_setup._logged_formats.clear()
        tiny_agent(seed=2)  # another trainer in the same process: no second warning
    assert [r.levelno for r in caplog.records if "chat template" in r.getMessage()] == [
        logging.INFO
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cmlrl_agents.policies.agent"):
        tiny_agent(seed=0, system_prompt="You are terse.")
    (record,) = [r for r in caplog.records if "chat template" in r.getMessage()]
    assert record.levelno == logging.INFO and "You are terse." in record.getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cmlrl_agents.policies.agent"):
        plain = tiny_agent(seed=0, chat_template=False)
    assert not [r for r in caplog.records if "chat template" in r.getMessage()]
    assert plain.chat_format is None


# ---------------------------------------- 5. custom eval metrics on several turns (SPEC §7)
def seed_eval_logger(*, agent_completions_turns, batch_items, prompts):
    # The seed's own example (seed 000, "ログ"), verbatim.
    return [
        {
            f"turn_{turn + 1}/response_chars": sum(
                len(agent[row][turn]) for agent in agent_completions_turns
            )
            / len(agent_completions_turns)
            for turn in range(len(agent_completions_turns[0][row]))
        }
        for row in range(len(batch_items))
    ]


def seed_eval_aggregator(rows, *, num_turns):
    return (
        {
            key: sum(row[key] for row in rows) / len(rows)
            for turn in range(num_turns)
            for key in [f"turn_{turn + 1}/response_chars"]
        }
        if rows
        else {}
    )


def test_seed_eval_callbacks_run_when_evaluation_items_end_early(tmp_path):
    # Item 0 scores 1.0 every turn (ends after turn 1 under threshold 0.9); item 1 scores 0.5.
    data = Dataset.from_list([{"prompt": "a", "r": 1.0}, {"prompt": "b", "r": 0.5}])

    def reward(c1, c2, *, batch_items):
        return [batch_items[0]["r"]] * len(c1)

    def feedback(prompt, agent_completions, num_agents, **history):
        return [f"again: {c}" for c in agent_completions]

    args = MAGRPOConfig(
        num_turns=2,
        num_generations=2,
        max_new_tokens=4,
        early_termination_threshold=0.9,
        eval_interval=0,
        output_dir=str(tmp_path / "run"),
        verbose=False,
    )
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        reward_func=reward,
        external_transition=feedback,
        train_dataset=data,
        eval_dataset=data,
        eval_logger=seed_eval_logger,
        eval_aggregator=seed_eval_aggregator,
        args=args,
    )
    metrics = trainer.evaluate(num_eval_samples=2)  # KeyError 'turn_2/response_chars' before
    assert "eval/turn_1/response_chars" in metrics and "eval/turn_2/response_chars" in metrics
    # Termination-aware, as in training: turn 2 counts item 1 only; item 0 holds 1.0 for it.
    assert metrics["eval/turn_1/reward_mean"] == pytest.approx(0.75)
    assert metrics["eval/turn_2/reward_mean"] == pytest.approx(0.5)
    assert metrics["eval/turn_1/expected_return"] == pytest.approx((2.0 + 1.0) / 2)
    assert metrics["eval/turn_2/expected_return"] == pytest.approx(0.5)
    # Beside them: every item's turn-2 answer (evaluation plays every turn) and the open share.
    assert metrics["eval/turn_2/reward_mean_all"] == pytest.approx(0.75)
    assert metrics["eval/turn_1/open_fraction"] == 1.0
    assert metrics["eval/turn_2/open_fraction"] == 0.5
