"""IAC/MAAC adapter agents of one base score together (one mixed-adapter pass per chunk): the
same update as agent by agent on two separate bases with the same weights (tiny models)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import LoraConfig

from cmlrl_agents import IACConfig, IACTrainer, MAACConfig, MAACTrainer
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import tasks

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]


def iac_config(out: Path, **overrides) -> IACConfig:
    fields = dict(
        num_generations=3,
        max_new_tokens=4,
        rollout_buffer_size=2,
        eval_interval=0,
        agent_learning_rate=1e-2,
        critic_learning_rate=1e-2,
        use_separate_critic=False,
        reference_kl_enabled=True,
        reference_kl_coef=0.5,
        ppo_clip_range=0.2,
        ppo_epochs=2,
        forward_batch_size=4,
        seed=0,
        output_dir=str(out),
    )
    return IACConfig(**{**fields, **overrides})


def team(cls, args, *, shared: Path | None, peft_config=LORA, **kwargs):
    """Adapter agents on one base (``shared``: its folder) or on two equal separate bases."""
    tokenizer = tiny_tokenizer()
    models = (
        {"agent_model": str(shared), "num_agents": 2}
        if shared is not None
        else {
            "agents": [tiny_model(len(tokenizer), 0), tiny_model(len(tokenizer), 0)],
            "tokenizer": tokenizer,
        }
    )
    return cls(
        **models,
        peft_config=peft_config,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset().select(range(4)),
        args=args,
        **kwargs,
    )


def adapter_state(agent) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in agent.model.named_parameters()
        if f".{agent.adapter}." in n
    }


def copy_adapters(source, target) -> None:
    """Give ``target``'s agents ``source``'s starting adapters (LoRA A is initialised at random)."""
    for mine, theirs in zip(source.agents, target.agents, strict=True):
        params = dict(mine.model.named_parameters())
        with torch.no_grad():
            for name, param in theirs.model.named_parameters():
                if f".{theirs.adapter}." in name:
                    param.copy_(params[name])


def count_forwards(models) -> list[int]:
    """A counter of forwards through the base models (policy and reference passes alike)."""
    calls = [0]
    for model in models:
        model.get_base_model().register_forward_pre_hook(
            lambda *_: calls.__setitem__(0, calls[0] + 1)
        )
    return calls


def round_tree(trainer):
    data = tasks.length_ratio_dataset()
    torch.manual_seed(0)
    return collect_tree(
        trainer.env,
        trainer.agents,
        [(data[i], i) for i in range(2)],
        num_generations=3,
        sampling=trainer.agent_sampling,
    )


def test_mixed_adapter_scoring_equals_each_adapter_alone(base_folder, tmp_path) -> None:
    trainer = team(IACTrainer, iac_config(tmp_path / "run"), shared=base_folder)
    a0, a1 = trainer.agents
    for agent in trainer.agents:  # move lora_B off zero, so the adapters differ
        with torch.no_grad():
            for name, param in agent.model.named_parameters():
                if f".{agent.adapter}." in name and "lora_B" in name:
                    param.normal_(0, 0.5)
    batch = build_batch([[1, 5, 6, 7], [1, 8, 9], [1, 4]], [[10, 11], [13, 14, 15], [3]], 0)
    joint = a0.score(batch, adapter_names=["agent_0", "agent_1", "agent_0"])
    alone = [a0.score(batch.select([0, 2])), a1.score(batch.select([1]))]
    torch.testing.assert_close(joint[[0, 2]], alone[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(joint[[1]], alone[1], rtol=0, atol=1e-6)
    assert not torch.allclose(a0.score(batch.select([1])), alone[1], atol=1e-4)


@pytest.mark.parametrize("ppo", [False, True])
def test_iac_joint_update_equals_agent_by_agent(base_folder, tmp_path, ppo) -> None:
    """Losses, KL, value losses and grad norms per agent, and the adapters and value heads after
    two updates, equal those of the same agents on two separate bases (stepped one by one)."""
    extra = {} if ppo else {"ppo_clip_range": None, "ppo_epochs": 1}
    shared = team(IACTrainer, iac_config(tmp_path / "a", **extra), shared=base_folder)
    separate = team(IACTrainer, iac_config(tmp_path / "b", **extra), shared=None)
    assert shared.learner.agent_groups() == [[0, 1]]
    assert separate.learner.agent_groups() == [[0], [1]]
    copy_adapters(shared, separate)
    tree = round_tree(shared)
    keys = [
        f"agent_{a}/{k}"
        for a in (0, 1)
        for k in ("policy_loss", "value_loss", "grad_norm", "turn_1/reference_kl_mean")
    ]
    for _ in range(2):  # the second update has a non-zero KL to the base
        got = shared.learner.update(shared.learner.batch(tree))
        want = separate.learner.update(separate.learner.batch(tree))
        for key in keys:
            # abs: a policy loss is a mean of +-A * log p terms of size ~10 that nearly cancel
            # (z-scored advantages), so float32 noise of 1e-7 per term shows at about 1e-5.
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-4), key
    assert want["agent_1/turn_1/reference_kl_mean"] > 0
    for agent, twin in zip(shared.agents, separate.agents, strict=True):
        mine, theirs = adapter_state(agent), adapter_state(twin)
        assert mine.keys() == theirs.keys() and len(mine) == 8
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name], rtol=1e-4, atol=1e-5)
    for critic, twin in zip(shared.critics, separate.critics, strict=True):
        theirs = dict(twin.head.named_parameters())
        for name, param in critic.head.named_parameters():
            torch.testing.assert_close(param, theirs[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ppo", [False, True])
def test_one_scoring_pass_for_the_whole_team(base_folder, tmp_path, ppo) -> None:
    """One minibatch, one chunk: the joint update runs one reference pass and one policy pass
    over the shared base; agent by agent runs each per agent. A round of one step is on-policy,
    so PPO's clipped form needs no pass for old log-probs."""
    extra = {"forward_batch_size": None, "ppo_epochs": 1}
    if not ppo:
        extra["ppo_clip_range"] = None
    shared = team(IACTrainer, iac_config(tmp_path / "a", **extra), shared=base_folder)
    separate = team(IACTrainer, iac_config(tmp_path / "b", **extra), shared=None)
    tree = round_tree(shared)
    counts = []
    for trainer in (shared, separate):
        batch = trainer.learner.batch(tree)  # the critics' value reads are not counted
        calls = count_forwards({id(a.model): a.model for a in trainer.agents}.values())
        trainer.learner.update(batch)
        counts.append(calls[0])
    assert counts == [2, 4]


def test_maac_adapter_agents_train_jointly_and_log(base_folder, tmp_path) -> None:
    args = MAACConfig(
        num_generations=2,
        max_new_tokens=4,
        rollout_buffer_size=2,
        eval_interval=0,
        agent_learning_rate=1e-2,
        critic_learning_rate=1e-2,
        forward_batch_size=3,
        output_dir=str(tmp_path / "run"),
    )
    trainer = team(MAACTrainer, args, shared=base_folder, critic_model=str(base_folder))
    assert trainer.learner.agent_groups() == [[0, 1]]
    base = {n: p.detach().clone() for n, p in trainer.agents[0].model.named_parameters()}
    before = [adapter_state(a) for a in trainer.agents]
    trainer.train()
    logged = {k for _, entry in trainer.logger.history for k in entry}
    assert {"agent_0/policy_loss", "agent_1/policy_loss", "critic/value_loss"} <= logged
    for name, param in trainer.agents[0].model.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, base[name]), name
    for agent, old in zip(trainer.agents, before, strict=True):
        new = adapter_state(agent)
        assert all(not torch.equal(new[n], old[n]) for n in old), agent.adapter


def test_adapters_with_active_dropout_step_one_by_one(base_folder, tmp_path) -> None:
    """peft's mixed-adapter batches need eval mode, which differs from training under dropout;
    the default (disable_dropout) sets the rates to 0, and the adapters score in one pass."""
    dropout = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"], lora_dropout=0.1)
    args = iac_config(tmp_path / "off", ppo_clip_range=None, ppo_epochs=1)
    assert team(
        IACTrainer, args, shared=base_folder, peft_config=dropout
    ).learner.agent_groups() == [[0, 1]]
    args = iac_config(tmp_path / "run", ppo_clip_range=None, ppo_epochs=1, disable_dropout=False)
    trainer = team(IACTrainer, args, shared=base_folder, peft_config=dropout)
    assert trainer.learner.agent_groups() == [[0], [1]]
    before = [adapter_state(a) for a in trainer.agents]
    metrics = trainer.learner.update(trainer.learner.batch(round_tree(trainer)))
    assert {"agent_0/policy_loss", "agent_1/value_loss"} <= set(metrics)
    for agent, old in zip(trainer.agents, before, strict=True):
        new = adapter_state(agent)
        assert any(not torch.equal(new[n], old[n]) for n in old), agent.adapter


@pytest.mark.parametrize("field", ["agent_devices", "reference_devices", "critic_devices"])
def test_meta_is_refused_as_a_device_naming_the_field(field) -> None:
    with pytest.raises(ValueError, match=f"^{field} asks for meta, a device whose tensors hold"):
        resolve_devices("meta", 2, field)
    with pytest.raises(ValueError, match=f"^{field} asks for meta"):
        resolve_devices(["cpu", "meta"], 2, field)
