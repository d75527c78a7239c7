"""Our side of `benchmarks/vs_comlrl.py --turns 1` (G = 4, 32 forced tokens; full fine-tuning, or
with SETUP=lora its adapter agents) as a plain script, for `benchmarks/profile_calls.py` to time
call by call:

    ITEMS=8 OMP_NUM_THREADS=1 taskset -c 0 python benchmarks/profile_calls.py \
        results/weight-gradients/vs_workload.py /tmp/vs-run
"""

import os
import sys
import time

import torch

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer, smollm2_path
from cmlrl_env import tasks

torch.manual_seed(0)
items, tokens = int(os.environ.get("ITEMS", 4)), 32
dataset = tasks.length_ratio_dataset()
train = dataset.select([i % len(dataset) for i in range(items)])
config = MAGRPOConfig(
    num_agents=2,
    num_turns=1,
    num_train_epochs=1,
    num_generations=4,
    max_new_tokens=tokens,
    min_new_tokens=tokens,
    eval_interval=0,
    logging_steps=1,
    early_termination_threshold=None,
    seed=0,
    output_dir=sys.argv[1],
)
peft = None
if os.environ.get("SETUP") == "lora":  # as vs_comlrl.py's adapter agents
    from peft import LoraConfig

    peft = LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )
    config.agent_learning_rate = 1e-4
trainer = MAGRPOTrainer(
    agent_model=str(smollm2_path()),
    train_dataset=train,
    args=config,
    model_config={"chat_template": False},
    peft_config=peft,
    formatters=[tasks.brief_formatter, tasks.detailed_formatter],
    reward_func=tasks.length_ratio_reward,
)
wall, cpu = time.perf_counter(), time.process_time()
trainer.train()
print("TRAIN wall", time.perf_counter() - wall, "cpu", time.process_time() - cpu)
