"""Training steps the env through its public group step, so the env's own checks apply there
exactly as in a plain ``reset``/``step`` loop (issue 10)."""

from __future__ import annotations

import re

import pytest

from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.policies.scripted import ScriptedLLMAgent
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import CoMLRLEnv, TaskSpec, tasks

ITEMS = tasks.length_ratio_dataset().select(range(2))
LONG = "twelve chars"  # 12 characters, over the limit of 8 below


def _agents(answer: str) -> list[ScriptedLLMAgent]:
    tokenizer = tiny_tokenizer()
    return [
        ScriptedLLMAgent(lambda prompt, g: answer, tiny_model(len(tokenizer), seed), tokenizer)
        for seed in range(2)
    ]


def _config(tmp_path) -> MAGRPOConfig:
    return MAGRPOConfig(
        num_generations=2, max_new_tokens=4, eval_interval=0, output_dir=str(tmp_path / "r")
    )


def _plain_loop_error(env: CoMLRLEnv, answer: str) -> str:
    env.reset(seed=0)
    with pytest.raises(ValueError) as caught:
        env.step({agent: answer for agent in env.agents})
    return str(caught.value)


@pytest.mark.parametrize("given", ["env", "task"])
def test_a_completion_over_max_completion_chars_fails_training_as_it_fails_a_plain_loop(
    tmp_path, given
) -> None:
    spec = TaskSpec(ITEMS, None, tasks.length_ratio_reward, max_completion_chars=8)
    message = _plain_loop_error(CoMLRLEnv.from_spec(spec), LONG)
    assert message == "the action of agent_0 has 12 characters, more than max_completion_chars=8."
    source = {"env": CoMLRLEnv.from_spec(spec)} if given == "env" else {"task": spec}
    trainer = MAGRPOTrainer(agents=_agents(LONG), args=_config(tmp_path), **source)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        trainer.train()
    assert trainer.env_step == 0


def test_a_prompt_over_max_prompt_chars_fails_training_as_it_fails_reset(tmp_path) -> None:
    spec = TaskSpec(ITEMS, None, tasks.length_ratio_reward, max_prompt_chars=20)
    with pytest.raises(ValueError) as caught:
        CoMLRLEnv.from_spec(spec).reset(seed=0)
    assert str(caught.value).startswith(
        "the prompt of agent_0 at turn 1 of item 0 has 30 characters, more than max_prompt_chars=20"
    )
    trainer = MAGRPOTrainer(agents=_agents("ok"), task=spec, args=_config(tmp_path))
    with pytest.raises(ValueError, match=f"^{re.escape(str(caught.value))}$"):
        trainer.train()


def test_completions_within_the_limit_train(tmp_path) -> None:
    spec = TaskSpec(ITEMS, None, tasks.length_ratio_reward, max_completion_chars=8)
    trainer = MAGRPOTrainer(agents=_agents("short"), task=spec, args=_config(tmp_path))
    trainer.train()
    assert trainer.env_step == 4  # 2 items x 2 joint actions
