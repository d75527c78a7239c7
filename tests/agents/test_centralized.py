"""One model for every role (CentralizedMAGRPOTrainer) and single-agent GRPO on the same rewards."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from datasets import Dataset

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.algorithms.centralized import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    JointReward,
    joint_prompt,
    split_roles,
)
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.agent import SamplingConfig
from cmlrl_agents.policies.scripted import ScriptedPolicy
from cmlrl_agents.testing import tiny_agent
from cmlrl_env import code_tasks, writing_tasks

SUMMARY = "one two three four five six seven eights"
EXPANSION = (
    "however alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima because "
    "mike then"
)
# With SUMMARY, by the paper's levels: 8 and 16 tokens (0.5), character ratio 2.45 (1.0), 16 / 8
# distinct words (0.5), 4 transition categories, "then" and "however" two each (0.4 x 0.55), no
# shared content word (0.6 x 0): 2.22.
TEAM_REWARD = 2.22


def test_the_trainer_is_a_top_level_name() -> None:
    import cmlrl_agents

    assert cmlrl_agents.CentralizedMAGRPOTrainer is CentralizedMAGRPOTrainer
    assert "CentralizedMAGRPOConfig" in cmlrl_agents.__all__


def test_joint_prompt_states_the_shared_context_once_then_the_tasks_then_the_form() -> None:
    prompt = joint_prompt(["Summarise this.\n\nThe passage.", "Expand this.\n\nThe passage."])
    assert prompt == (
        "The passage.\n\n"
        "Do these 2 tasks on the text above:\n1. Summarise this.\n2. Expand this.\n\n"
        "Reply in exactly this form, one answer under each heading:\n"
        "Task 1: <your answer to task 1>\nTask 2: <your answer to task 2>"
    )
    # Nothing in common: each prompt whole; a prompt never loses its own instruction.
    assert joint_prompt(["A.", "B."]).startswith("Do these 2 tasks:\n1. A.\n2. B.\n\n")
    assert joint_prompt(["X\n\nP", "P"]).startswith("Do these 2 tasks:\n1. X\n\nP\n2. P")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Task 1: a\nTask 2: b", ["a", "b"]),
        ("Sure!\n\nTask 1:\nfirst\nline\n\n**Task 2:** second", ["first\nline", "second"]),
        ("## Answer 1.\nx\n### answer 2) y", ["x", "y"]),
        ("TASK 1 - x\nTask 2: y\nTask 1: x again\nTask 2: y again", ["x", "y"]),  # repeated
        # The first heading 1, then the first heading 2 after it; any heading ends an answer.
        ("Task 2: b\nTask 1: a\nTask 3: c\nTask 2: b2", ["a", "b2"]),
        # No heading: exactly one fenced block per role, fences kept (the code reward reads them).
        (
            "```python\ndef aux(): pass\n```\ntext\n```\nmain()\n```",
            ["```python\ndef aux(): pass\n```", "```\nmain()\n```"],
        ),  # noqa: E501
        ("```python\nx = 1\n```", None),
        ("Task 1: a", None),  # a role missing
        ("Task 1:\nTask 2: b", None),  # an empty answer
        ("no headings at all", None),
    ],
)
def test_split_roles_by_hand_worked_examples(text, expected) -> None:
    assert split_roles(text, 2) == expected


def test_unparsable_completions_get_the_penalty_and_skip_the_reward() -> None:
    calls = []

    def reward(summaries, expansions):
        calls.append((list(summaries), list(expansions)))
        return writing_tasks.writing_reward(summaries, expansions)

    joint = JointReward(reward, 2, parse_failure_reward=-1.0)
    good = f"Task 1: {SUMMARY}\nTask 2: {EXPANSION}"
    rewards = joint([good, "no headings", good], batch_items=[{"prompt": "p"}])
    assert rewards == pytest.approx([TEAM_REWARD, -1.0, TEAM_REWARD])
    assert calls == [([SUMMARY, SUMMARY], [EXPANSION, EXPANSION])]  # one call, parsed only
    assert joint(["no headings"], batch_items=[{"prompt": "p"}]) == [-1.0]
    assert len(calls) == 1


def make_trainer(tmp_path, **config) -> CentralizedMAGRPOTrainer:
    train, evaluation = writing_tasks.writing_splits()
    defaults = dict(
        num_generations=2,
        max_new_tokens=6,
        rollout_buffer_size=2,
        eval_interval=0,
        eval_num_samples=2,
        logging_steps=1,
        agent_learning_rate=1e-3,
        output_dir=str(tmp_path / "run"),
    )
    return CentralizedMAGRPOTrainer(
        agents=[tiny_agent(seed=0)],
        formatters=[writing_tasks.summary_formatter, writing_tasks.expansion_formatter],
        reward_func=writing_tasks.writing_reward,
        train_dataset=train.select(range(4)),
        eval_dataset=evaluation,
        args=CentralizedMAGRPOConfig(**{**defaults, **config}),
    )


def test_the_joint_policy_sees_every_role_and_is_scored_by_the_team_reward(tmp_path) -> None:
    trainer = make_trainer(tmp_path)
    assert (trainer.num_agents, trainer.num_roles) == (1, 2)
    item = writing_tasks.writing_dataset()[0]
    script = ScriptedPolicy(
        lambda prompt, g: f"Task 1: {SUMMARY}\nTask 2: {EXPANSION}" if g == 0 else "unparsable"
    )
    tree = collect_tree(
        trainer.env, [script], [(item, 0)], num_generations=2, sampling=SamplingConfig()
    )
    (prompt,), _ = script.calls[0]
    # The passage once, then each role's instruction (its prompt without the shared passage).
    assert prompt.count(item["prompt"]) == 1
    for formatter in (writing_tasks.summary_formatter, writing_tasks.expansion_formatter):
        assert formatter(item).removesuffix(item["prompt"]).strip() in prompt
    assert tree.levels[0].rewards.tolist() == [[pytest.approx(TEAM_REWARD), -1.0]]


def test_training_changes_the_one_model_and_logs_the_loss(tmp_path) -> None:
    # A random model never writes the headings: every reward is the penalty, so a raw
    # (REINFORCE) advantage gives the gradient that pushes those completions down.
    trainer = make_trainer(tmp_path, advantage_mode="raw", advantage_normalization=False)
    before = copy.deepcopy(trainer.agents[0].model.state_dict())
    trainer.train()
    changed = [
        n for n, p in trainer.agents[0].model.named_parameters() if not torch.equal(p, before[n])
    ]
    assert len(changed) == len(before)
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    train_rows = [r for r in rows if "loss" in r]
    assert len(train_rows) == 2 and all(r["turn_1/reward_mean"] == -1.0 for r in train_rows)


def test_eval_logger_receives_the_split_role_outputs(tmp_path) -> None:
    seen = {}

    def logger(*, agent_completions_turns, batch_items, prompts):
        seen["completions"] = agent_completions_turns
        return [{"n": 1.0} for _ in batch_items]

    trainer = make_trainer(tmp_path)
    trainer.eval_logger = logger
    trainer.eval_aggregator = lambda rows, *, num_turns: {"rows": float(len(rows))}
    metrics = trainer.evaluate(num_eval_samples=2)
    assert len(seen["completions"]) == 2  # two roles, each [item][turn]
    assert [len(c) for c in seen["completions"][0]] == [1, 1]
    assert metrics["eval/rows"] == 2.0 and metrics["eval/parse_rate"] == 0.0


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_turns": 2}, "plays one turn; set num_turns=1"),
        ({"num_agents": 2}, "trains one policy; set num_roles"),
        ({"num_roles": 3}, "the number of roles disagrees"),
    ],
)
def test_bad_settings_are_refused_at_construction(tmp_path, config, message) -> None:
    with pytest.raises(ValueError, match=message):
        make_trainer(tmp_path, **config)


def test_a_transition_is_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="takes no external_transition"):
        CentralizedMAGRPOTrainer(
            agents=[tiny_agent()],
            formatters=[code_tasks.helper_formatter, code_tasks.main_formatter],
            reward_func=code_tasks.humaneval_reward,
            external_transition=code_tasks.code_feedback,
            train_dataset=Dataset.from_dict({"prompt": ["x"]}),
            args=CentralizedMAGRPOConfig(output_dir=str(tmp_path / "run")),
        )


def test_single_agent_grpo_trains_on_the_code_reward(tmp_path) -> None:
    train, _ = code_tasks.humaneval_splits()
    args = MAGRPOConfig(
        num_agents=1,
        num_generations=2,
        max_new_tokens=6,
        rollout_buffer_size=2,
        eval_interval=0,
        logging_steps=1,
        advantage_mode="raw",
        advantage_normalization=False,
        output_dir=str(tmp_path / "run"),
    )
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(seed=2)],
        formatters=[code_tasks.single_formatter],
        reward_func=code_tasks.humaneval_single_reward,
        train_dataset=train.select(range(2)),
        args=args,
    )
    helper = "def aux(number):\n    return number % 1.0\n"
    # main builds on aux (not a bare wrapper), so every level and bonus is earned: 4.0.
    main = (
        "def truncate_number(number):\n    part = aux(number)\n"
        "    return part if part >= 0 else part + 1.0\n"
    )
    item = code_tasks.humaneval_dataset(["HumanEval/2"])[0]
    script = ScriptedPolicy(lambda prompt, g: f"```python\n{helper}\n{main}```" if g else "")
    tree = collect_tree(
        trainer.env, [script], [(item, 2)], num_generations=2, sampling=SamplingConfig()
    )
    assert tree.levels[0].rewards.tolist() == [[0.0, 4.0]]
    trainer.train()
    rows = [
        json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    ]
    # 2 items x 2 samples; the update itself is MAGRPO's tested one-agent (GRPO) step.
    assert [r["env_step"] for r in rows if "loss" in r] == [4]
