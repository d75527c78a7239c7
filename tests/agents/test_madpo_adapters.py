"""MADPO with adapter agents: N LoRA adapters over ONE frozen base, the base (adapters off) as
the DPO reference; tiny offline models."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel
from safetensors.torch import load_file

from cmlrl_agents import MADPOConfig, MADPOTrainer
from cmlrl_agents.functional.preference_losses import dpo_loss, joint_log_ratio
from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.reference import BaseWithoutAdapters
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import tasks

FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]


def lora(dropout: float = 0.0) -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=dropout)


def config(out: Path, **kw) -> MADPOConfig:
    defaults = dict(
        max_new_tokens=6, agent_learning_rate=1e-2, eval_interval=0, seed=0, output_dir=str(out)
    )
    return MADPOConfig(**{**defaults, **kw})


def shared_trainer(base_folder: Path, out: Path, peft_config=None, **kw) -> MADPOTrainer:
    return MADPOTrainer(
        agent_model=str(base_folder),
        num_agents=2,
        peft_config=lora() if peft_config is None else peft_config,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_splits()[0],
        args=config(out, **kw),
    )


def adapter_state(model: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{name}." in n}


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def test_one_base_held_once_is_also_the_reference_and_only_adapters_train(base_folder, tmp_path):
    trainer = shared_trainer(base_folder, tmp_path / "run")
    model = trainer.agents[0].model
    assert trainer.agents[1].model is model and isinstance(model, PeftModel)
    refs = trainer.reference_models
    assert refs[0] is refs[1] and isinstance(refs[0], BaseWithoutAdapters)
    assert refs[0].model is model  # no copy of the base anywhere
    for agent, optimizer in zip(trainer.agents, trainer.optimizers, strict=True):
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        assert held == {id(p) for p in agent.trainable_parameters()} and len(held) == 8
    base_before = base_state(model)
    adapters_before = [adapter_state(model, a.adapter) for a in trainer.agents]
    last = trainer.train()
    assert {"loss", "dpo/accuracy", "dpo/margin", "agent_0/grad_norm", "agent_1/grad_norm"} <= set(
        last
    )
    assert all(math.isfinite(v) for v in last.values())
    for name, value in base_state(model).items():
        assert torch.equal(value, base_before[name]), name
    for agent, before in zip(trainer.agents, adapters_before, strict=True):
        after = adapter_state(model, agent.adapter)
        assert all(not torch.equal(after[n], before[n]) for n in before), agent.adapter
    # The reference is still the untouched base: the tiny model's own log-probs.
    tokenizer = tiny_tokenizer()
    batch = build_batch([[1, 5, 6, 7], [1, 8]], [[10, 11, 12], [13, 14]], tokenizer.pad_token_id)
    expected = sequence_logprobs(tiny_model(len(tokenizer), 0), batch)
    torch.testing.assert_close(refs[0].logprobs(batch), expected, rtol=0, atol=1e-6)
    assert not torch.allclose(trainer.agents[1].score(batch).detach(), expected, atol=1e-4)


def perturb_and_copy(source: MADPOTrainer, twins: MADPOTrainer) -> None:
    """Non-zero lora_B (so pi != pi_ref), and the same adapters in the twin trainer."""
    generator = torch.Generator().manual_seed(3)
    model = source.agents[0].model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))
        weights = dict(model.named_parameters())
        for twin in twins.agents:
            for name, p in twin.model.named_parameters():
                if f".{twin.adapter}." in name:
                    p.copy_(weights[name])


def separate_trainer(out: Path, peft_config: LoraConfig, **kw) -> MADPOTrainer:
    """The same team with one base per agent (identical weights): every agent alone."""
    tokenizer = tiny_tokenizer()
    return MADPOTrainer(
        agents=[tiny_model(len(tokenizer), 0), tiny_model(len(tokenizer), 0)],
        tokenizer=tokenizer,
        peft_config=peft_config,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_splits()[0],
        args=config(out, **kw),
    )


def test_the_joint_step_equals_the_dpo_loss_and_gradients_computed_agent_by_agent(
    base_folder, tmp_path
):
    shared = shared_trainer(base_folder, tmp_path / "a")
    twins = separate_trainer(tmp_path / "b", lora())
    perturb_and_copy(shared, twins)
    pairs = shared.build_pairs(0)
    data = shared.learner.prepare(pairs)
    base = tiny_model(len(tiny_tokenizer()), 0)
    # By hand, each agent on its own base with its own adapter: log-probs, loss, gradients.
    pol, ref = [], []
    for a, twin in enumerate(twins.agents):
        both = build_batch(
            data.prompts[a] * 2, data.chosen[a] + data.rejected[a], twin.pad_token_id
        )
        pol.append(sequence_logprobs(twin.model, both).sum(dim=1))
        ref.append(sequence_logprobs(base, both).sum(dim=1).detach())
    n = len(pairs)
    pol, ref = torch.stack(pol), torch.stack(ref)
    torch.testing.assert_close(data.ref_chosen, ref[:, :n], rtol=0, atol=1e-5)
    torch.testing.assert_close(data.ref_rejected, ref[:, n:], rtol=0, atol=1e-5)
    chosen = joint_log_ratio(pol[:, :n], ref[:, :n])
    rejected = joint_log_ratio(pol[:, n:], ref[:, n:])
    loss = dpo_loss(chosen, rejected, 0.1).sum() / n
    params = [twin.trainable_parameters() for twin in twins.agents]
    grads = torch.autograd.grad(loss, [p for ps in params for p in ps])
    norms = [
        float(torch.sqrt(sum((g**2).sum() for g in grads[:8]))),
        float(torch.sqrt(sum((g**2).sum() for g in grads[8:]))),
    ]
    stats = shared.learner.step(data, range(n))  # one mixed-adapter pass over the shared base
    assert stats["loss"] == pytest.approx(float(loss), rel=1e-5)
    assert stats["margin"] != 0.0  # the adapters moved the policy off the reference
    for a in range(2):
        assert norms[a] > 0
        assert stats[f"agent_{a}/grad_norm"] == pytest.approx(norms[a], rel=1e-4), a


def test_adapters_of_a_base_with_dropout_step_agent_by_agent_and_all_train(base_folder, tmp_path):
    """With dropout the agents of one base score one by one; activating agent 1's adapter
    freezes agent 0's, yet both step exactly as on two separate bases (same dropout draws)."""
    keep = {"disable_dropout": False}  # the trainers' default sets every rate to 0
    shared = shared_trainer(base_folder, tmp_path / "a", peft_config=lora(0.2), **keep)
    twins = separate_trainer(tmp_path / "b", lora(0.2), **keep)
    perturb_and_copy(shared, twins)
    pairs = shared.build_pairs(0)
    results = []
    for trainer in (shared, twins):
        data = trainer.learner.prepare(pairs)
        torch.manual_seed(7)
        results.append(trainer.learner.step(data, range(len(pairs))))
    for key in ("loss", "agent_0/grad_norm", "agent_1/grad_norm"):
        assert results[0][key] == pytest.approx(results[1][key], rel=1e-5), key
    assert results[0]["agent_0/grad_norm"] > 0 and results[0]["agent_1/grad_norm"] > 0
    for agent, twin in zip(shared.agents, twins.agents, strict=True):
        mine = adapter_state(agent.model, agent.adapter)
        theirs = adapter_state(twin.model, twin.adapter)
        for name, value in mine.items():
            torch.testing.assert_close(value, theirs[name], rtol=1e-5, atol=1e-6)


def test_checkpoints_hold_adapters_only_and_resume_is_exact(base_folder, tmp_path):
    kw = dict(num_iterations=2, num_train_epochs=2, save_steps=1)
    full = shared_trainer(base_folder, tmp_path / "run", **kw)
    full.train()
    checkpoints = sorted(
        (tmp_path / "run" / "checkpoints").iterdir(), key=lambda p: p.stat().st_mtime
    )
    saved = load_file(str(checkpoints[0] / "model-shared_base_0.safetensors"))
    assert saved and all("lora_" in key for key in saved)
    assert {key.split("/")[0] for key in saved} == {"agent_0", "agent_1"}
    assert not list(checkpoints[0].glob("model-agent_*"))
    resumed = shared_trainer(base_folder, tmp_path / "run", **kw)
    resumed.train(resume_from_checkpoint=checkpoints[0])  # round 0, one of two epochs done
    for agent in full.agents:
        want = adapter_state(full.agents[0].model, agent.adapter)
        got = adapter_state(resumed.agents[0].model, agent.adapter)
        assert want.keys() == got.keys()
        for name in want:
            torch.testing.assert_close(got[name], want[name], msg=name)
    assert resumed.env_step == full.env_step


def test_save_model_folders_load_with_peft(base_folder, tmp_path):
    trainer = shared_trainer(base_folder, tmp_path / "run")
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    tokenizer = tiny_tokenizer()
    batch = build_batch([[1, 5, 6, 7]], [[10, 11, 12]], tokenizer.pad_token_id)
    for agent in trainer.agents:
        folder = tmp_path / "saved" / agent.adapter
        assert not (folder / "model.safetensors").exists()
        loaded = PeftModel.from_pretrained(tiny_model(len(tokenizer), 0), folder)
        torch.testing.assert_close(
            sequence_logprobs(loaded, batch), agent.score(batch).detach(), rtol=0, atol=1e-6
        )


def test_adapter_errors_name_the_argument(base_folder, tmp_path):
    with pytest.raises(ValueError, match="peft_config is a list of 3 configs but there are 2"):
        shared_trainer(base_folder, tmp_path / "run", peft_config=[lora()] * 3)
    with pytest.raises(TypeError, match="peft_config must be a peft adapter config"):
        shared_trainer(base_folder, tmp_path / "run", peft_config={"r": 4})


def test_reference_devices_place_madpo_copies_but_adapters_have_none(base_folder, tmp_path):
    tokenizer = tiny_tokenizer()
    trainer = MADPOTrainer(
        agents=[tiny_model(len(tokenizer), 0), tiny_model(len(tokenizer), 1)],
        tokenizer=tokenizer,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        args=config(tmp_path / "copies", reference_devices="cpu"),
    )
    for agent, reference in zip(trainer.agents, trainer.reference_models, strict=True):
        assert isinstance(reference, torch.nn.Module) and reference is not agent.model
        assert {p.device.type for p in reference.parameters()} == {"cpu"}
    with pytest.raises(ValueError, match="adapter agents \\(peft_config\\) have none"):
        shared_trainer(base_folder, tmp_path / "run", reference_devices="cpu")
