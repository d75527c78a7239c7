"""One `generate` call of SmolLM2-135M-Instruct under torch.profiler: 2 prompts x 4 samples, 48
tokens, the MAGRPO defaults' sampling (temperature 0.6, top-k 50, top-p 0.6), one thread,
operators by self CPU time, then grouped by input shape too. Where a decoding step's time goes.

    OMP_NUM_THREADS=1 taskset -c 1 python results/round-time-amd-avx512/decode_ops.py
"""

import time

import torch
from torch.profiler import ProfilerActivity, profile

from cmlrl_agents import smollm2_path
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.sampling import SamplingConfig, row_key
from cmlrl_env import tasks

torch.set_num_threads(1)
agent = LLMAgent.from_pretrained(str(smollm2_path()))
prompts = [tasks.detailed_formatter(item) for item in tasks.length_ratio_dataset().select(range(2))]
sampling = SamplingConfig(max_new_tokens=48, temperature=0.6, top_p=0.6, top_k=50)
keys = [row_key(0, p, g) for p in range(2) for g in range(4)]
agent.generate(prompts, 4, sampling, keys=keys)  # warm up
start = time.process_time()
agent.generate(prompts, 4, sampling, keys=keys)
print(f"generate: {time.process_time() - start:.2f} CPU s")
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    agent.generate(prompts, 4, sampling, keys=keys)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))  # by operator
table = prof.key_averages(group_by_input_shape=True)  # and by operator and shape
print(table.table(sort_by="self_cpu_time_total", row_limit=30))
