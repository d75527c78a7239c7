"""LoRA agents (peft) train through the same trainer: only adapter weights move and are saved."""

from __future__ import annotations

import torch
from peft import LoraConfig, get_peft_model

from cmlrl_agents import LLMAgent, MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.testing import tiny_model, tiny_tokenizer
from cmlrl_env import tasks


def lora_agent(seed: int) -> LLMAgent:
    tokenizer = tiny_tokenizer()
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return LLMAgent(get_peft_model(tiny_model(len(tokenizer), seed), config), tokenizer)


def test_lora_agents_train_only_their_adapters_and_checkpoint_them(tmp_path):
    torch.manual_seed(0)  # peft draws lora_A here, before the trainer (and its seed) exists
    agents = [lora_agent(0), lora_agent(1)]
    before = [{n: p.detach().clone() for n, p in a.model.named_parameters()} for a in agents]
    args = MAGRPOConfig(
        num_generations=4,  # 2 samples often tie, and an all-tied run moves no weight at all
        max_new_tokens=4,
        rollout_buffer_size=2,
        eval_interval=0,
        agent_learning_rate=1e-2,
        save_steps=4,
        seed=0,  # the samples' keys
        output_dir=str(tmp_path / "run"),
    )
    trainer = MAGRPOTrainer(
        agents=agents,
        formatters=[tasks.brief_formatter, tasks.detailed_formatter],
        reward_func=tasks.length_ratio_reward,
        train_dataset=tasks.length_ratio_dataset().select(range(4)),
        args=args,
    )
    trainer.train()
    for agent, old in zip(agents, before, strict=True):
        for name, param in agent.model.named_parameters():
            changed = not torch.equal(param.detach(), old[name])
            assert changed == ("lora_" in name), name
    checkpoint = tmp_path / "run" / "checkpoints" / "checkpoint-4"
    from safetensors.torch import load_file

    saved = load_file(str(checkpoint / "model-agent_0.safetensors"))
    assert saved and all("lora_" in key for key in saved)
