"""Mixed-adapter generation: each adapter's rows as a slice (``policies/adapter_spans.py``)
against peft's gathered rows, and against the base alone.

Two LoRA adapters (rank 16, alpha 32, on the attention's q, k, v and o projections, as
``vs_comlrl.py``'s adapter agents) on one SmolLM2-135M-Instruct base (local, SPEC §9); one
``generate_rows`` call of ``--rows`` rows (the first half under one adapter, the second under
the other, as a team's call comes agent by agent) of the seed's length-ratio prompts in the
chat template, ``--tokens`` forced tokens, the library's sampling defaults, a key per row.
Each repeat runs the three sides in a rotated order, so that every side shares the machine's
load; the table gives process CPU seconds per call (median over ``--repeats``) and whether the
slices sampled peft's tokens.

    OMP_NUM_THREADS=1 python benchmarks/adapter_spans.py --threads 1 --rows 16 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import AbstractContextManager, nullcontext
from unittest import mock

import torch
from option_checks import refuse_below_one
from peft import LoraConfig, get_peft_model

from cmlrl_agents.policies import agent as agent_module
from cmlrl_agents.policies.agent import LLMAgent, SamplingConfig
from cmlrl_agents.policies.gguf import smollm2_path
from cmlrl_agents.policies.sampling import row_key
from cmlrl_env import tasks

SIDES = ("slices", "peft", "base")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default=None, help="default: the local SmolLM2 folder")
    args = parser.parse_args(argv)
    refuse_below_one(parser, args, ("tokens", "repeats", "threads"))
    if args.rows < 4 or args.rows % 4:
        parser.error(f"--rows must be a multiple of 4 (2 adapters x 2 prompts), got {args.rows}")
    return args


def _lora() -> LoraConfig:
    return LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )


def two_adapter_agent(model: str) -> LLMAgent:
    agent = LLMAgent.from_pretrained(model)
    peft_model = get_peft_model(agent.model, _lora(), "agent_0")
    peft_model.add_adapter("agent_1", _lora())
    return LLMAgent(peft_model.eval(), agent.tokenizer, adapter="agent_0")


def _side(agent: LLMAgent, side: str) -> AbstractContextManager[object]:
    """peft's gathered rows (the slices' forwards not put in), the base alone (the adapters
    disabled), or the library as it is."""
    if side == "peft":
        return mock.patch.object(
            agent_module, "adapter_span_forwards", lambda model, names: nullcontext()
        )
    if side == "base":
        return agent.model.disable_adapter()  # type: ignore[operator]
    return nullcontext()


def generation(agent: LLMAgent, rows: int, tokens: int, repeats: int) -> None:
    items = tasks.length_ratio_dataset().select(range(2))
    prompts = agent.encode_prompts([tasks.detailed_formatter(item) for item in items])
    # Half the rows under each adapter, each half both prompts' samples.
    ids = [list(p) for _ in range(2) for p in prompts for _ in range(rows // 4)]
    names = [f"agent_{a}" for a in range(2) for _ in range(rows // 2)]
    keys = [row_key(0, r) for r in range(rows)]
    sampling = SamplingConfig(max_new_tokens=tokens, min_new_tokens=tokens)
    seconds: dict[str, list[float]] = {side: [] for side in SIDES}
    tokens_of: dict[str, list[tuple[int, ...]]] = {}
    for repeat in range(repeats):
        for side in SIDES[repeat % 3 :] + SIDES[: repeat % 3]:
            with _side(agent, side):
                start = time.process_time()
                done = agent.generate_rows(ids, sampling, adapter_names=names, keys=keys)
                seconds[side].append(time.process_time() - start)
            tokens_of[side] = [c.completion_ids for c in done]
    median = {side: statistics.median(seconds[side]) for side in SIDES}
    print(f"generate_rows, {rows} rows (2 adapters), {tokens} forced tokens: CPU s per call")
    for side in SIDES:
        runs = ", ".join(f"{s:.2f}" for s in seconds[side])
        ratio = median[side] / median["peft"]
        print(f"  {side:6s} {median[side]:6.2f} ({ratio:.2f}x peft's; runs {runs})")
    print(f"  the slices sampled peft's tokens: {tokens_of['slices'] == tokens_of['peft']}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    agent = two_adapter_agent(args.model or str(smollm2_path()))
    agent.generate(["warm up"], 1, SamplingConfig(max_new_tokens=2))
    generation(agent, args.rows, args.tokens, args.repeats)


if __name__ == "__main__":
    main()
