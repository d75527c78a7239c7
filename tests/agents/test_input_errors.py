"""Inputs that used to run silently or fail with a foreign error (issue 9, items 13-18)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from datasets import Dataset

from cmlrl_agents import IACConfig, MAACConfig, MAGRPOConfig
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.scripted import ScriptedPolicy
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import CoMLRLEnv, RewardProcessors, Task
from cmlrl_env.task_check import check_task

INF = math.inf


# ------------------------------------------------------------------ 13. config values
@pytest.mark.parametrize(
    ("config_class", "field"),
    [
        (MAGRPOConfig, "agent_learning_rate"),
        (MAGRPOConfig, "temperature"),
        (MAGRPOConfig, "reference_kl_coef"),
        (MAGRPOConfig, "max_grad_norm"),
        (MAGRPOConfig, "early_termination_threshold"),
        (IACConfig, "critic_learning_rate"),
        (IACConfig, "value_loss_coef"),
        (IACConfig, "value_clip_range"),
        (IACConfig, "ppo_clip_range"),
        (MAACConfig, "value_loss_coef"),
    ],
)
@pytest.mark.parametrize("value", [INF, -INF])
def test_infinite_numbers_are_refused_with_the_field_named(config_class, field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be (finite|>|>=)"):
        config_class(**{field: value})
    config = config_class()
    before = getattr(config, field)
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        setattr(config, field, value)
    assert getattr(config, field) == before


def test_infinite_positive_values_name_finiteness():
    with pytest.raises(ValueError, match=r"^agent_learning_rate must be finite, got inf\.$"):
        MAGRPOConfig(agent_learning_rate=INF)
    with pytest.raises(ValueError, match=r"max_grad_norm must be finite, got inf \(None turns"):
        MAGRPOConfig(max_grad_norm=INF)


@pytest.mark.parametrize("field", ["adam_beta1", "adam_beta2"])
def test_adam_betas_must_lie_in_0_to_1_when_built_and_assigned(field: str) -> None:
    with pytest.raises(ValueError, match=rf"^{field} must be in \[0, 1\) .*got 1\.0;"):
        MAGRPOConfig(**{field: 1.0})
    with pytest.raises(ValueError, match=rf"^{field} must be >= 0\.0, got -0\.1\.$"):
        IACConfig(**{field: -0.1})
    config = MAGRPOConfig()
    with pytest.raises(ValueError, match=rf"^{field} must be in \[0, 1\)"):
        setattr(config, field, 1.5)


def test_adam_epsilon_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^adam_epsilon must be > 0\.0, got 0\.0\.$"):
        MAGRPOConfig(adam_epsilon=0.0)


def test_seed_must_fit_numpy():
    assert MAGRPOConfig(seed=2**32 - 1).seed == 2**32 - 1
    with pytest.raises(ValueError, match=r"seed must be <= 4294967295 .*got 4294967296"):
        MAGRPOConfig(seed=2**32)
    with pytest.raises(ValueError, match=r"seed must be >= 0, got -1"):
        MAGRPOConfig(seed=-1)


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_output_dir_is_refused(value):
    with pytest.raises(ValueError, match=r"output_dir=.* is empty; give a folder path, or None"):
        MAGRPOConfig(output_dir=value)


def test_zero_epochs_are_refused():
    with pytest.raises(ValueError, match=r"num_train_epochs must be >= 1, got 0"):
        MAGRPOConfig(num_train_epochs=0)
    with pytest.raises(ValueError, match=r"num_train_epochs must be >= 1, got 0"):
        IACConfig(num_train_epochs=0)


# ------------------------------------------------- 18. rewards, processors, check_task
def _env(reward, processor=None):
    return CoMLRLEnv(
        Dataset.from_list([{"prompt": "p"}]),
        None,
        reward,
        num_agents=2,
        reward_processor=processor,
    )


@pytest.mark.parametrize("bad", [10**400, Fraction(10**400, 3)])
def test_a_reward_too_large_for_a_float_names_reward_func_and_position(bad):
    def huge_reward(c1, c2):
        return [0.5, bad]

    env = _env(huge_reward)
    env.reset(seed=0)
    task = env.task
    state = task.initial_state({"prompt": "p"}, 0)
    with pytest.raises(
        ValueError,
        match=r"reward_func .*huge_reward returned .* at position 1 for item 0, which is not "
        r"convertible to a float",
    ):
        task.step_group([state], [[("a", "b"), ("c", "d")]])


def test_a_processor_result_too_large_names_the_processor_and_position():
    env = _env(lambda c1, c2: [1.0] * len(c1), processor=lambda r: 10**400)
    state = env.task.initial_state({"prompt": "p"}, 0)
    with pytest.raises(
        ValueError,
        match=r"reward_processor .* into 1000.*0; it must return .* \(reward at position 0\)",
    ):
        env.task.step_group([state], [[("a", "b")]])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"low": math.nan}, r"clip's low must be a real number \(math.inf for no bound\), got nan"),
        ({"high": "1"}, r"clip's high must be a real number .* got '1'"),
        ({"low": None}, r"clip's low must be a real number .* got None"),
        ({"low": True}, r"clip's low must be a real number .* got True"),
        ({"low": 2.0, "high": 1.0}, r"clip needs low <= high, got low=2.0, high=1.0"),
    ],
)
def test_clip_checks_its_bounds(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RewardProcessors.clip(**kwargs)


def test_clip_scale_and_shift_defaults():
    assert RewardProcessors.clip(high=1.0)(3.0) == 1.0
    assert RewardProcessors.clip()(-1e300) == -1e300  # infinite bounds: no bound
    assert RewardProcessors.scale()(0.25) == 0.25  # the reference's default factor 1.0
    assert RewardProcessors.shift()(0.25) == 0.25  # the reference's default value 0.0
    assert RewardProcessors.scale(factor=10.0)(0.25) == 2.5
    assert RewardProcessors.shift(value=-1.0)(0.25) == -0.75
    with pytest.raises(ValueError, match=r"factor must be a finite real number, got 1000"):
        RewardProcessors.scale(10**400)


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        ([1, 2], r"sample_completions\[0\] is 1; each entry must be a str"),
        ([None], r"sample_completions\[0\] is None"),
        ([["a"], [2]], r"sample_completions\[1\] is \[2\]"),
        ({"a": ["x"]}, r"sample_completions must be a non-empty list of str"),
    ],
)
def test_check_task_checks_the_shape_of_sample_completions(samples, message):
    # Checked first: even a task that would not bind reports this argument, not a foreign error.
    with pytest.raises(TypeError, match=message):
        check_task(Dataset.from_list([{"prompt": "p"}]), None, None, sample_completions=samples)


# -------------------------------------------------------- 15. models that cannot work
@pytest.mark.parametrize("name", ["/no/such/folder", "./missing-model", "~/missing/model/x"])
def test_a_missing_local_model_folder_says_so(name):
    with pytest.raises(FileNotFoundError, match=r"model folder .* does not exist"):
        LLMAgent.from_pretrained(name)


def test_a_missing_folder_inside_an_existing_one_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(FileNotFoundError, match=r"model folder 'models/typo' does not exist"):
        LLMAgent.from_pretrained("models/typo")


def test_a_model_with_a_smaller_vocabulary_than_its_tokenizer_is_refused():
    tokenizer = tiny_tokenizer()
    small = tiny_model(len(tokenizer) - 10)
    with pytest.raises(
        ValueError,
        match=r"vocabulary has 249 embeddings but its tokenizer has 259 tokens, so ids "
        r"249..258 would fail",
    ):
        LLMAgent(small, tokenizer)
    assert LLMAgent(tiny_model(len(tokenizer) + 5), tokenizer)  # larger (padded) is fine


# ------------------------------------------------- 17. text a tokenizer cannot encode
def test_a_lone_surrogate_in_a_prompt_names_the_agent_and_item():
    def formatter_b(item):
        return "broken \ud800 text"

    task = Task([lambda item: item["prompt"], formatter_b], lambda c1, c2: [0.0] * len(c1))
    policies = [ScriptedPolicy(lambda p, g: "x"), ScriptedPolicy(lambda p, g: "y")]
    with pytest.raises(
        ValueError,
        match=r"the turn-1 prompt of agent_1 for item 7 holds '\\ud800' at character 7, which "
        r"no tokenizer can encode",
    ):
        collect_tree(
            task, policies, [({"prompt": "p"}, 7)], num_generations=1, sampling=SamplingConfig()
        )
    assert policies[0].calls == []  # refused before any generation
