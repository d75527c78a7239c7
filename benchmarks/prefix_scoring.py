"""Prefix-shared scoring against the unshared pass: one forward + backward of a training chunk.

SmolLM2-135M-Instruct (local, see SPEC §9), the seed's length-ratio prompts in the chat template
(detailed formatter), ``--generations`` completions of ``--tokens`` tokens per prompt (sampled by
the model once, then fixed), ``--prompts`` prompts per chunk (2 x G = 8 rows: the default
``forward_batch_size``). Each repeat runs both paths in alternating order on the same batch and
times forward + backward; the median of the per-repeat ratios is printed, with the FLOPs of
each (torch's FlopCounterMode: independent of machine load) and the largest difference in
log-probs and gradients between the two.

    OMP_NUM_THREADS=1 python benchmarks/prefix_scoring.py --tokens 48 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.gguf import smollm2_path
from cmlrl_agents.policies.logprobs import sequence_logprobs
from cmlrl_agents.policies.prefix_scoring import prefix_shared_logprobs
from cmlrl_agents.policies.tokens import build_batch
from cmlrl_env import tasks


def _batch(agent: LLMAgent, prompts: int, generations: int, tokens: int):
    items = tasks.length_ratio_dataset().select(range(prompts))
    texts = [tasks.detailed_formatter(item) for item in items]
    sampling = SamplingConfig(max_new_tokens=tokens, min_new_tokens=tokens)
    rows = [c for group in agent.generate(texts, generations, sampling) for c in group]
    batch = build_batch(
        [c.prompt_ids for c in rows], [c.completion_ids for c in rows], agent.pad_token_id
    )
    return batch, [len(c.prompt_ids) for c in rows]


def _pass(model, batch, score, advantages) -> tuple[float, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logprobs = score(model, batch)
    (-(logprobs.sum(dim=1) * advantages).mean()).backward()
    seconds = time.perf_counter() - start
    return seconds, logprobs.detach(), [p.grad.clone() for p in model.parameters()]


def _flops(model, batch, score, advantages) -> int:
    """Forward + backward FLOPs counted by torch (matmuls and attention): machine-independent,
    unlike the timings on a shared machine."""
    from torch.utils.flop_counter import FlopCounterMode

    model.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        (-(score(model, batch).sum(dim=1) * advantages).mean()).backward()
    return counter.get_total_flops()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    agent = LLMAgent.from_pretrained(str(smollm2_path()))
    batch, prompt_lens = _batch(agent, args.prompts, args.generations, args.tokens)
    model = agent.model.train()
    advantages = torch.randn(batch.input_ids.shape[0])
    ratios, diffs = [], (0.0, 0.0)
    order = [sequence_logprobs, prefix_shared_logprobs]
    for r in range(args.repeats):
        results = {f: _pass(model, batch, f, advantages) for f in order[:: 1 - 2 * (r % 2)]}
        (t_plain, lp_plain, g_plain) = results[sequence_logprobs]
        (t_shared, lp_shared, g_shared) = results[prefix_shared_logprobs]
        ratios.append(t_plain / t_shared)
        # Relative to the parameter's largest gradient: float32 rounding, not a wrong term.
        grad = max(
            float((a - b).abs().max() / a.abs().max().clamp(min=1e-12))
            for a, b in zip(g_plain, g_shared, strict=True)
        )
        diffs = (max(diffs[0], float((lp_plain - lp_shared).abs().max())), max(diffs[1], grad))
        print(f"repeat {r}: unshared {t_plain:.3f} s, shared {t_shared:.3f} s")
    print(
        f"rows {batch.input_ids.shape[0]}, prompt tokens {min(prompt_lens)}-{max(prompt_lens)}, "
        f"completion tokens {args.tokens}, threads {torch.get_num_threads()}"
    )
    plain, shared = (_flops(model, batch, f, advantages) for f in order)
    print(
        f"FLOPs forward + backward: unshared {plain:.3e}, shared {shared:.3e}, "
        f"ratio {plain / shared:.2f}x"
    )
    print(
        f"max |logprob diff| {diffs[0]:.2e}, "
        f"max |grad diff| / max |grad| (per parameter) {diffs[1]:.2e}"
    )
    print(
        f"speed-up (unshared time / shared time), median of {args.repeats}: "
        f"{statistics.median(ratios):.2f}x"
    )


if __name__ == "__main__":
    main()
