"""What a comlrl script brings along: device placement fields, ``train_dataset=None``, model
names in the run config, critic arguments checked first (issue 9, items 21, 22, 24, 25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.algorithms.actor_critic import IACTrainer, MAACTrainer
from cmlrl_agents.algorithms.actor_critic_config import IACConfig, MAACConfig
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_tokenizer
from cmlrl_env import tasks

MISSING_MODEL = "no-such-org/no-such-model"  # reaching the loader would raise about this name
TASK = {
    "formatters": [tasks.brief_formatter, tasks.detailed_formatter],
    "reward_func": tasks.length_ratio_reward,
}
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def small(**fields) -> dict:
    return (
        dict(num_generations=2, max_new_tokens=3, rollout_buffer_size=2, eval_interval=0) | fields
    )


def total_length(first: list[str], second: list[str]) -> list[float]:
    return [float(len(a) + len(b)) for a, b in zip(first, second, strict=True)]


def train_items(n: int = 2):
    return tasks.length_ratio_dataset().select(range(n))


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A tiny model saved as a from_pretrained folder."""
    folder = tmp_path_factory.mktemp("models") / "tiny-llama"
    tokenizer = tiny_tokenizer()
    tiny_model(len(tokenizer), 0, eos_bias=4.0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


# ------------------------------------------------------------------ 21: device placement
@pytest.mark.parametrize("devices", ["cpu", ["cpu"], ["cpu", "cpu"], "auto"])
def test_agent_and_reference_devices_place_the_models(tmp_path, devices):
    # EOS is likely and the reward counts characters, so completions differ in reward: the step
    # has a signal (with no spread only the KL term's float noise would move the weights).
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0, eos_bias=1.0), tiny_agent(1, eos_bias=1.0)],
        train_dataset=train_items(),
        args=MAGRPOConfig(
            **small(
                agent_devices=devices,
                reference_kl_enabled=True,
                reference_devices=devices,
                num_generations=4,
                max_new_tokens=6,
            ),
            output_dir=str(tmp_path / "run"),
        ),
        formatters=TASK["formatters"],
        reward_func=total_length,
    )
    expected = "cuda" if devices == "auto" and torch.cuda.is_available() else "cpu"
    assert [a.device.type for a in trainer.agents] == [expected, expected]
    refs = trainer.reference_models
    assert [next(r.parameters()).device.type for r in refs] == [expected, expected]
    before = [p.detach().clone() for p in trainer.agents[0].model.parameters()]
    metrics = trainer.train()
    assert "loss" in metrics and "turn_1/reference_kl_mean" in metrics
    assert metrics["groups/zero_spread_fraction"] < 1.0
    after = list(trainer.agents[0].model.parameters())
    assert any(not torch.equal(b, a) for b, a in zip(before, after, strict=True))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"agent_devices": "banana"}, "agent_devices has 'banana', which is not a device"),
        ({"agent_devices": ["cpu", 0]}, "agent_devices entries must be device strings"),
        ({"agent_devices": []}, "agent_devices must be a device string"),
        ({"reference_devices": "cuda:0:1"}, "reference_devices has 'cuda:0:1'"),
        ({"parallel_training": "mp"}, "agent_devices=\\['cuda:0', 'cuda:1'"),
    ],
)
def test_bad_device_settings_are_refused_by_the_config(fields, message):
    with pytest.raises((TypeError, ValueError), match=message):
        MAGRPOConfig(**fields)


def test_parallel_training_none_is_what_we_do():
    assert MAGRPOConfig(parallel_training="none").parallel_training == "none"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"agent_devices": ["cpu"] * 3}, "agent_devices has 3 devices for 2 agent"),
        ({"agent_devices": "cuda:7"}, "agent_devices asks for cuda:7 but this machine has"),
        (
            {"reference_devices": "cpu", "reference_kl_enabled": False},
            "exist only with reference_kl_enabled=True",
        ),
    ],
)
def test_device_mismatches_are_refused_before_any_model_loads(fields, message):
    if "cuda:7" in str(fields) and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    with pytest.raises(ValueError, match=message):
        MAGRPOTrainer(
            agent_model=MISSING_MODEL,
            train_dataset=train_items(),
            args=MAGRPOConfig(**fields),
            **TASK,
        )


def test_agent_devices_and_model_config_device_cannot_both_place(model_folder):
    with pytest.raises(ValueError, match=r"model_config\['device'\].*agent_devices both place"):
        MAGRPOTrainer(
            agent_model=str(model_folder),
            model_config={"device": "cpu"},
            train_dataset=train_items(),
            args=MAGRPOConfig(agent_devices="cpu"),
            **TASK,
        )


def test_critic_devices_place_separate_critics_and_are_refused_with_heads(tmp_path):
    tokenizer = tiny_tokenizer()
    trainer = MAACTrainer(
        agents=[tiny_model(len(tokenizer), i) for i in (0, 1)],
        critics=[tiny_model(len(tokenizer), 9)],
        tokenizer=tokenizer,
        train_dataset=train_items(),
        args=MAACConfig(
            max_new_tokens=3, agent_devices="cpu", critic_devices=["cpu"], output_dir=str(tmp_path)
        ),
        **TASK,
    )
    assert trainer.critics[0].device.type == "cpu"
    with pytest.raises(ValueError, match="critic_devices has 2 devices for 1 critic"):
        MAACTrainer(
            agent_model=MISSING_MODEL,
            critic_model=MISSING_MODEL,
            train_dataset=train_items(),
            args=MAACConfig(critic_devices=["cpu", "cpu"]),
            **TASK,
        )
    with pytest.raises(ValueError, match="each value head lives on its actor"):
        IACTrainer(
            agent_model=MISSING_MODEL,
            train_dataset=train_items(),
            args=IACConfig(use_separate_critic=False, critic_devices="cpu"),
            **TASK,
        )


@needs_cuda
def test_models_loaded_by_name_go_straight_to_their_cuda_device(model_folder, tmp_path):
    trainer = MAGRPOTrainer(
        agent_model=str(model_folder),
        train_dataset=train_items(),
        args=MAGRPOConfig(
            **small(agent_devices="cuda:0", reference_kl_enabled=True),
            output_dir=str(tmp_path / "run"),
        ),
        **TASK,
    )
    for agent, ref in zip(trainer.agents, trainer.reference_models, strict=True):
        assert {p.device.type for p in agent.model.parameters()} == {"cuda"}
        assert {p.device.type for p in ref.parameters()} == {"cuda"}
        # loaded with device_map (straight onto the GPU), which from_pretrained records
        assert {str(torch.device(d)) for d in agent.model.hf_device_map.values()} == {"cuda:0"}
    assert "loss" in trainer.train()


@needs_cuda
def test_actor_critic_on_cuda_trains(tmp_path):
    tokenizer = tiny_tokenizer()
    trainer = IACTrainer(
        agents=[tiny_model(len(tokenizer), i, eos_bias=4.0) for i in (0, 1)],
        critics=[tiny_model(len(tokenizer), 9 + i) for i in (0, 1)],
        tokenizer=tokenizer,
        train_dataset=train_items(),
        args=IACConfig(
            max_new_tokens=3,
            rollout_buffer_size=2,
            agent_devices="cuda:0",
            eval_interval=0,
            output_dir=str(tmp_path),
        ),
        **TASK,
    )
    assert {c.device.type for c in trainer.critics} == {"cuda"}  # beside their agents
    assert "agent_0/value_loss" in trainer.train()


# ------------------------------------------------------------ 22: train_dataset=None
def test_without_train_dataset_the_trainer_evaluates_and_saves_but_does_not_train(tmp_path):
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        eval_dataset=tasks.length_ratio_dataset().select(range(8, 10)),
        args=MAGRPOConfig(**small(eval_num_samples=2), output_dir=str(tmp_path / "run")),
        **TASK,
    )
    assert trainer.env is None
    metrics = trainer.evaluate()
    assert set(metrics) == {
        "eval/turn_1/reward_mean",
        "eval/turn_1/expected_return",
        "eval/turn_1/reward_sem",
    }
    with pytest.raises(ValueError, match="built without train_dataset.*train_dataset=\\.\\.\\."):
        trainer.train()
    trainer.save_model(tmp_path / "saved")
    assert (tmp_path / "saved" / "agent_1" / "config.json").is_file()


def test_save_only_needs_neither_dataset_nor_reward(tmp_path):
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)], args=MAGRPOConfig(output_dir=str(tmp_path))
    )
    assert trainer.evaluate() == {}
    trainer.save_model(tmp_path / "saved")
    assert (tmp_path / "saved" / "agent_0" / "model.safetensors").is_file()
    with pytest.raises(ValueError, match="reward_func is required"):
        MAGRPOTrainer(
            agents=[tiny_agent(0), tiny_agent(1)],
            eval_dataset=train_items(),
            args=MAGRPOConfig(output_dir=str(tmp_path)),
        )


# ------------------------------------------------------------------- 24: model names
def test_model_names_go_into_the_run_config(model_folder, tmp_path):
    trainer = IACTrainer(
        agent_model=str(model_folder),
        critic_model=str(model_folder),
        train_dataset=train_items(),
        args=IACConfig(max_new_tokens=3, output_dir=str(tmp_path / "run")),
        **TASK,
    )
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["models"] == [str(model_folder)] * 2
    assert config["critic_models"] == [str(model_folder)] * 2
    # the W&B run is started with this same config
    assert trainer.logger.config["models"] == config["models"]
    in_memory = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        train_dataset=train_items(),
        args=MAGRPOConfig(output_dir=str(tmp_path / "other")),
        **TASK,
    )
    assert in_memory.logger.config["models"] == ["LlamaForCausalLM"] * 2


# ------------------------------------------------- 25: critic arguments before any model
@pytest.mark.parametrize(
    ("cls", "config", "critics", "message"),
    [
        (IACTrainer, IACConfig(), {}, "use_separate_critic=True needs critic_model"),
        (MAACTrainer, MAACConfig(), {}, "MAACTrainer needs its centralised critic"),
        (IACTrainer, IACConfig(), {"critics": [object()]}, "IACTrainer needs 2"),
        (MAACTrainer, MAACConfig(), {"critics": [object()] * 2}, "MAACTrainer needs 1"),
        (
            IACTrainer,
            IACConfig(use_separate_critic=False),
            {"critic_model": MISSING_MODEL},
            "critic_model/critics would be unused",
        ),
        (
            IACTrainer,
            IACConfig(),
            {"critic_model": MISSING_MODEL, "critics": [object()] * 2},
            "not both",
        ),
        (IACTrainer, IACConfig(), {"critic_model": object()}, "one model object but 2 critics"),
    ],
)
def test_critic_arguments_are_checked_before_any_model_loads(cls, config, critics, message):
    with pytest.raises(ValueError, match=message):
        cls(agent_model=MISSING_MODEL, train_dataset=train_items(), args=config, **TASK, **critics)


def test_comlrl_train_arguments_say_where_they_went(tmp_path):
    trainer = MAGRPOTrainer(
        agents=[tiny_agent(0), tiny_agent(1)],
        train_dataset=train_items(),
        args=MAGRPOConfig(**small(), output_dir=str(tmp_path)),
        **TASK,
    )
    with pytest.raises(TypeError) as err:
        trainer.train(checkpoint_dir="ck", checkpoint_interval=1, repetition_penalty=1.2)
    message = str(err.value)
    assert "checkpoint_dir -> args.output_dir" in message
    assert "checkpoint_interval -> args.save_steps (counted in training task items" in message
    assert "repetition_penalty -> a config field if it is a generation setting" in message
    assert trainer.items_seen == 0
