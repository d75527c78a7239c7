"""Adapter agents: N LoRA adapters over ONE frozen base (``peft_config=``), tiny offline models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, PeftModel, PrefixTuningConfig, get_peft_model
from safetensors.torch import load_file

from cmlrl_agents import IACConfig, IACTrainer, MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.foundation.rollout import collect_tree
from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import tasks

LORA = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
FORMATTERS = [tasks.brief_formatter, tasks.detailed_formatter]


def make_trainer(base_folder: Path, out: Path, cls=MAGRPOTrainer, args=None, **kwargs):
    if args is None:
        args = MAGRPOConfig(
            num_generations=2,
            max_new_tokens=4,
            rollout_buffer_size=2,
            eval_interval=0,
            agent_learning_rate=1e-2,
            save_steps=2,
            reference_kl_enabled=True,
            seed=0,
            output_dir=str(out),
        )
    return cls(
        agent_model=str(base_folder),
        num_agents=2,
        peft_config=kwargs.pop("peft_config", LORA),
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset().select(range(4)),
        args=args,
        **kwargs,
    )


def base_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def adapter_state(model: torch.nn.Module, name: str) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if f".{name}." in n}


def probe_batch(tokenizer):
    return build_batch([[1, 5, 6, 7], [1, 8, 9]], [[10, 11, 12], [13, 14]], tokenizer.pad_token_id)


def test_one_base_n_adapters_each_trains_only_its_own(base_folder, tmp_path):
    trainer = make_trainer(base_folder, tmp_path / "run")
    a0, a1 = trainer.agents
    model = a0.model
    assert a1.model is model and isinstance(model, PeftModel)
    assert [a.adapter for a in trainer.agents] == ["agent_0", "agent_1"]
    # One base in memory: the PeftModel's non-adapter parameters are exactly one tiny model's.
    plain = tiny_model(len(tiny_tokenizer()), 0)
    assert sum(p.numel() for p in base_state(model).values()) == sum(
        p.numel() for p in plain.parameters()
    )
    # Each optimizer holds exactly its adapter's parameters, nothing of the base or the other.
    for agent, optimizer in zip(trainer.agents, trainer.optimizers, strict=True):
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        own = {id(p) for n, p in model.named_parameters() if f".{agent.adapter}." in n}
        assert held == own and len(own) == 8  # q, v in 2 layers x (A, B)
    base_before = base_state(model)
    adapters_before = [adapter_state(model, a.adapter) for a in trainer.agents]
    metrics = trainer.train()
    assert "loss" in metrics and "turn_1/reference_kl_mean" in metrics
    for name, value in base_state(model).items():
        assert torch.equal(value, base_before[name]), name
    for agent, before in zip(trainer.agents, adapters_before, strict=True):
        after = adapter_state(model, agent.adapter)
        # lora_B starts at zero and moves; every tensor of the adapter changes.
        assert all(not torch.equal(after[n], before[n]) for n in before), agent.adapter


def test_kl_reference_is_the_base_without_adapters(base_folder, tmp_path):
    trainer = make_trainer(base_folder, tmp_path / "run")
    trainer.train()
    refs = trainer.reference_models
    assert refs[0] is refs[1]  # one reference for the shared base, no copy
    assert not any(isinstance(r, torch.nn.Module) for r in refs)
    tokenizer = tiny_tokenizer()
    batch = probe_batch(tokenizer)
    expected = sequence_logprobs(tiny_model(len(tokenizer), 0), batch)
    torch.testing.assert_close(refs[0].logprobs(batch), expected, rtol=0, atol=1e-6)
    # The trained adapters do change the policy: the agent's own log-probs differ.
    assert not torch.allclose(trainer.agents[0].score(batch).detach(), expected, atol=1e-4)


def test_save_model_writes_one_loadable_adapter_folder_per_agent(base_folder, tmp_path):
    trainer = make_trainer(base_folder, tmp_path / "run")
    trainer.train()
    trainer.save_model(tmp_path / "saved")
    tokenizer = tiny_tokenizer()
    batch = probe_batch(tokenizer)
    for agent in trainer.agents:
        folder = tmp_path / "saved" / agent.adapter
        assert (folder / "adapter_config.json").is_file()
        assert not (folder / "model.safetensors").exists()  # the adapter only, no base copy
        loaded = PeftModel.from_pretrained(tiny_model(len(tokenizer), 0), folder)
        torch.testing.assert_close(
            sequence_logprobs(loaded, batch), agent.score(batch).detach(), rtol=0, atol=1e-6
        )


def test_checkpoint_holds_adapters_only_and_resume_restores_them_exactly(base_folder, tmp_path):
    first = make_trainer(base_folder, tmp_path / "run")
    first.train()
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-4"
    saved = load_file(str(checkpoint / "model-shared_base_0.safetensors"))
    assert saved and all("lora_" in key for key in saved)
    assert {key.split("/")[0] for key in saved} == {"agent_0", "agent_1"}
    assert not list(checkpoint.glob("model-agent_*"))
    second = make_trainer(base_folder, tmp_path / "run")
    second.load_checkpoint(checkpoint)
    for agent in first.agents:
        want = adapter_state(first.agents[0].model, agent.adapter)
        got = adapter_state(second.agents[0].model, agent.adapter)
        assert want.keys() == got.keys()
        assert all(torch.equal(want[n], got[n]) for n in want)
    for opt_a, opt_b in zip(first.optimizers, second.optimizers, strict=True):
        state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
        assert state_a.keys() == state_b.keys()
        for key in state_a:
            assert torch.equal(state_a[key]["exp_avg"], state_b[key]["exp_avg"])


def test_a_list_of_configs_gives_per_agent_adapters(base_folder, tmp_path):
    configs = [LORA, LoraConfig(r=2, lora_alpha=4, target_modules=["k_proj"], lora_dropout=0.0)]
    trainer = make_trainer(base_folder, tmp_path / "run", peft_config=configs)
    model = trainer.agents[0].model
    a0, a1 = adapter_state(model, "agent_0"), adapter_state(model, "agent_1")
    assert all("q_proj" in n or "v_proj" in n for n in a0) and len(a0) == 8
    assert all("k_proj" in n for n in a1) and len(a1) == 4
    assert {tuple(t.shape) for n, t in a1.items() if "lora_A" in n} == {(2, 32)}


def test_given_models_keep_one_base_per_distinct_model(tmp_path):
    tokenizer = tiny_tokenizer()
    base_a, base_b = tiny_model(len(tokenizer), 0), tiny_model(len(tokenizer), 1)
    args = MAGRPOConfig(
        num_generations=2,
        max_new_tokens=4,
        eval_interval=0,
        save_steps=2,
        output_dir=str(tmp_path / "run"),
    )
    trainer = MAGRPOTrainer(
        agents=[base_a, base_b],
        tokenizer=tokenizer,
        peft_config=LORA,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset().select(range(2)),
        args=args,
    )
    assert trainer.agents[0].model is not trainer.agents[1].model
    trainer.train()
    names = sorted(p.name for p in (tmp_path / "run/checkpoints/checkpoint-2").glob("model-*"))
    assert names == ["model-shared_base_0.safetensors", "model-shared_base_1.safetensors"]


def test_iac_adapter_agents_get_a_value_head_each(base_folder, tmp_path):
    args = IACConfig(
        num_generations=2,
        max_new_tokens=4,
        rollout_buffer_size=2,
        eval_interval=0,
        agent_learning_rate=1e-2,
        use_separate_critic=False,
        output_dir=str(tmp_path / "run"),
    )
    trainer = make_trainer(base_folder, tmp_path / "run", cls=IACTrainer, args=args)
    model = trainer.agents[0].model
    assert trainer.agents[1].model is model
    assert trainer.critics[0].head is not trainer.critics[1].head
    base_before = base_state(model)
    before = [adapter_state(model, a.adapter) for a in trainer.agents]
    heads = [{n: p.detach().clone() for n, p in c.head.named_parameters()} for c in trainer.critics]
    metrics = trainer.train()
    assert "loss" in metrics or "agent_0/policy_loss" in metrics
    assert all(torch.equal(v, base_before[n]) for n, v in base_state(model).items())
    for agent, old in zip(trainer.agents, before, strict=True):
        new = adapter_state(model, agent.adapter)
        assert any(not torch.equal(new[n], old[n]) for n in old), agent.adapter
    for critic, old in zip(trainer.critics, heads, strict=True):
        assert any(not torch.equal(p, old[n]) for n, p in critic.head.named_parameters())


def test_peft_config_errors_name_the_argument(base_folder, tmp_path):
    tokenizer = tiny_tokenizer()
    wrapped = get_peft_model(tiny_model(len(tokenizer), 0), LORA)
    common = {
        "formatters": FORMATTERS,
        "reward_func": tasks.length_ratio_reward,
        "args": MAGRPOConfig(output_dir=str(tmp_path / "run")),
    }
    with pytest.raises(ValueError, match=r"agents\[0\] is already a PeftModel"):
        MAGRPOTrainer(agents=[wrapped, wrapped], tokenizer=tokenizer, peft_config=LORA, **common)
    with pytest.raises(ValueError, match="peft_config is a list of 3 configs but there are 2"):
        MAGRPOTrainer(agent_model=str(base_folder), peft_config=[LORA] * 3, **common)
    with pytest.raises(TypeError, match="peft_config must be a peft adapter config"):
        MAGRPOTrainer(agent_model=str(base_folder), peft_config={"r": 8}, **common)
    prefix = PrefixTuningConfig(num_virtual_tokens=2, task_type="CAUSAL_LM")
    with pytest.raises(TypeError, match=r"peft_config\[1\] must be a peft adapter config"):
        MAGRPOTrainer(agent_model=str(base_folder), peft_config=[LORA, prefix], **common)


def test_a_bf16_base_stays_bf16_and_the_adapters_are_float32(tmp_path):
    tokenizer = tiny_tokenizer()
    folder = tmp_path / "bf16"
    tiny_model(len(tokenizer), 0).to(torch.bfloat16).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    trainer = MAGRPOTrainer(
        agent_model=str(folder),
        num_agents=2,
        peft_config=LORA,
        model_config={"dtype": torch.bfloat16},
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        args=MAGRPOConfig(output_dir=str(tmp_path / "run")),
    )
    model = trainer.agents[0].model
    assert {p.dtype for p in base_state(model).values()} == {torch.bfloat16}
    for agent in trainer.agents:
        assert {p.dtype for p in agent.trainable_parameters()} == {torch.float32}


def test_joint_scoring_of_a_shared_base_equals_agent_by_agent_updates(base_folder, tmp_path):
    """Adapter agents of one base score in mixed-adapter passes; the same update computed agent
    by agent (two separate bases with the same weights) gives the same losses and adapters."""

    def config(out):
        return MAGRPOConfig(
            num_generations=3,
            max_new_tokens=4,
            forward_batch_size=4,
            eval_interval=0,
            agent_learning_rate=1e-2,
            reference_kl_enabled=True,
            reference_kl_coef=0.5,
            output_dir=str(tmp_path / out),
        )

    shared = make_trainer(base_folder, tmp_path / "a", args=config("a"))
    tokenizer = tiny_tokenizer()
    separate = MAGRPOTrainer(
        agents=[tiny_model(len(tokenizer), 0), tiny_model(len(tokenizer), 0)],
        tokenizer=tokenizer,
        peft_config=LORA,
        formatters=FORMATTERS,
        reward_func=tasks.length_ratio_reward,
        args=config("b"),
    )
    assert shared.agents[0].model is shared.agents[1].model
    assert separate.agents[0].model is not separate.agents[1].model
    for agent in separate.agents:  # the same starting adapters
        source = dict(shared.agents[0].model.named_parameters())
        with torch.no_grad():
            for name, param in agent.model.named_parameters():
                if f".{agent.adapter}." in name:
                    param.copy_(source[name])
    data = tasks.length_ratio_dataset()
    tree = collect_tree(
        shared.env,
        shared.agents,
        [(data[i], i) for i in range(2)],
        num_generations=3,
        sampling=shared.agent_sampling,
    )
    for _ in range(2):  # the second update has a non-zero KL to the base
        got = shared.learner.update(shared.learner.batch(tree))
        want = separate.learner.update(separate.learner.batch(tree))
        for key in ("agent_0/loss", "agent_1/loss", "agent_1/turn_1/reference_kl_mean"):
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert want["agent_1/turn_1/reference_kl_mean"] > 0
    for agent, twin in zip(shared.agents, separate.agents, strict=True):
        mine, theirs = (
            adapter_state(agent.model, agent.adapter),
            adapter_state(twin.model, twin.adapter),
        )
        for name in mine:
            torch.testing.assert_close(mine[name], theirs[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("disable_dropout", [True, False])
def test_a_stale_steps_ratio_is_one_before_the_policy_moves_despite_lora_dropout(
    base_folder, tmp_path, disable_dropout
) -> None:
    # Two steps per round at lr 1e-9: the second step's ratio to the round's "old" log-probs
    # measures only what differs between the two scoring passes of (almost) one policy.
    args = MAGRPOConfig(
        num_generations=4,
        max_new_tokens=6,
        rollout_buffer_size=2,
        train_batch_size=1,
        eval_interval=0,
        agent_learning_rate=1e-9,
        seed=0,
        output_dir=str(tmp_path / "run"),
        disable_dropout=disable_dropout,
    )
    dropout = LoraConfig(  # random B, as after training: dropout acts on the adapters' output
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        lora_dropout=0.1,
        init_lora_weights=False,
    )
    trainer = make_trainer(base_folder, tmp_path / "run", args=args, peft_config=dropout)
    trainer.train()
    rows = [json.loads(line) for line in (trainer.run_dir / "metrics.jsonl").open()]
    ratio_max = max(r[f"agent_{a}/ratio_max"] for r in rows for a in (0, 1) if "loss" in r)
    clipped = max(r[f"agent_{a}/clipfrac"] for r in rows for a in (0, 1) if "loss" in r)
    if disable_dropout:  # the default: one function, so the ratio is 1 and nothing clips
        assert ratio_max == pytest.approx(1.0, abs=1e-5) and clipped == 0.0
    else:  # another dropout draw in each pass: the ratio moves with no policy change
        assert ratio_max > 1.01
