"""The floor: one MAGRPO round written directly with transformers, against one round of ours.

The floor is the least code that does one round's work: per agent one batched ``generate`` of
the N chat-templated prompts x G samples, the seed's length-ratio reward, group-normalised
advantages, one padded forward with gradients over the N x G sequences, backward, gradient
clipping and one AdamW step; no cmlrl code. ``--setup lora`` does the same with one frozen base
and a LoRA adapter per agent (peft: ``set_adapter`` before each agent's generate and step, AdamW
over that adapter) against ours with the same ``peft_config``. Ours is ``MAGRPOTrainer`` with
``rollout_buffer_size = N``, so one ``train()`` of one epoch over the N items is one round.
Both force every completion to ``--tokens`` tokens (``min_new_tokens = max_new_tokens``) and
sample with our default settings, so they do the same work. They run alternately in one
process, ``--repeats`` times each; the best time of each is compared (the first round of each
pays one-time costs such as AdamW's state allocation).

    python benchmarks/floor.py                   # 2 agents, G=4, 4 items, 48 tokens, SmolLM2
    python benchmarks/floor.py --items 2 --tokens 16 --repeats 1
    python benchmarks/floor.py --setup lora

Prints the floor's seconds per round, ours (the whole ``train()`` call, and the round alone:
``collect_tree`` plus ``learner.update``) and the ratio to the floor (target: within 1.2x), in
wall seconds and in process CPU seconds (the figure to trust on a shared machine). Then the share
of the machine's peak each reaches (``benchmarks/peak.py``): FLOPs of a round (counted in one
more round of each, after the timed ones) over the fastest timed round's process CPU seconds,
against an fp32 matrix multiply timed the same way in the same run at the same threads;
generation and the update apart.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from peak import RoundMeter, format_shares, matmul_peak
from transformers import AutoModelForCausalLM, AutoTokenizer

from cmlrl_env import tasks

if TYPE_CHECKING:  # imported lazily: parsing the arguments needs no trainer
    from datasets import Dataset

    from cmlrl_agents import MAGRPOTrainer

FORMATTERS = (tasks.brief_formatter, tasks.detailed_formatter)
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_p": 0.6, "top_k": 50}  # our defaults
ADAPTERS = ("agent_0", "agent_1")


def lora_config():
    """The adapter set-up of benchmarks/vs_comlrl.py (r = 16 over q/k/v/o)."""
    from peft import LoraConfig

    return LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.0,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
    )


def chat_ids(tokenizer, texts: list[str]) -> dict[str, torch.Tensor]:
    """The chat-templated prompts, left-padded (as ``generate`` wants them)."""
    rendered = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
        )
        for t in texts
    ]
    tokenizer.padding_side = "left"
    return tokenizer(rendered, return_tensors="pt", padding=True, add_special_tokens=False)


def sample(model, tokenizer, prompts: dict[str, torch.Tensor], g: int, tokens: int):
    """One batched generate of every prompt x ``g``; the full sequences and their masks."""
    model.eval()
    with torch.inference_mode():
        out = model.generate(
            **prompts,
            num_return_sequences=g,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=tokenizer.pad_token_id,
            **SAMPLING,
        )
    mask = torch.cat(
        [prompts["attention_mask"].repeat_interleave(g, 0), torch.ones_like(out[:, -tokens:])], 1
    )
    return out.clone(), mask


def policy_step(model, optimizer, ids, mask, tokens: int, advantages: torch.Tensor) -> None:
    """One padded forward with gradients, the sequence-sum policy-gradient loss, one step."""
    model.train()
    optimizer.zero_grad(set_to_none=True)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # left padding: positions start at 0
    # Logits only where they score a completion token (the vocabulary projection is costly).
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=tokens + 1
    )
    logits = out.logits[:, :-1].float()
    logprobs = torch.log_softmax(logits, -1).gather(-1, ids[:, -tokens:, None]).squeeze(-1)
    loss = -(advantages * logprobs.sum(-1)).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def floor_round(models, optimizers, tokenizer, items: list[dict], g: int, tokens: int) -> None:
    """One round; ``models`` holds one model per agent, or (lora) the one base for both."""
    sequences, texts = [], []
    lora = len(models) == 1
    models = [models[0]] * len(FORMATTERS) if lora else models
    for a, (model, fmt) in enumerate(zip(models, FORMATTERS, strict=True)):
        if lora:
            model.set_adapter(ADAPTERS[a])
        prompts = chat_ids(tokenizer, [fmt(item) for item in items])
        ids, mask = sample(model, tokenizer, prompts, g, tokens)
        sequences.append((ids, mask))
        texts.append(tokenizer.batch_decode(ids[:, -tokens:], skip_special_tokens=True))
    rows = [item for item in items for _ in range(g)]
    rewards = torch.tensor(tasks.length_ratio_reward(*texts, batch_items=rows)).view(-1, g)
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-8)
    steps = zip(models, optimizers, sequences, strict=True)
    for a, (model, optimizer, (ids, mask)) in enumerate(steps):
        if lora:
            model.set_adapter(ADAPTERS[a])
        policy_step(model, optimizer, ids, mask, tokens, adv.reshape(-1))


CPU: dict[str, list[float]] = {"floor": [], "train": [], "round": []}
"""Process CPU seconds of each timed call: the figure to compare on a shared machine."""


def timed(fn: Callable[[], object], name: str) -> float:
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    CPU[name].append(time.process_time() - cpu)
    return time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=4, help="task items in the round (N)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--setup", choices=["full", "lora"], default="full")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own)")
    parser.add_argument("--model", help="model folder (default: the local SmolLM2-135M-Instruct)")
    args = parser.parse_args(argv)
    if args.threads is not None and args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    for name in ("items", "tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def build_ours(model_dir: str, data: Dataset, tokens: int, out: str, lora: bool) -> MAGRPOTrainer:
    """Our trainer for the same round: ``rollout_buffer_size`` = N, so one epoch is one round."""
    from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer

    config = MAGRPOConfig(
        num_agents=2,
        num_turns=1,
        num_train_epochs=1,
        num_generations=4,
        max_new_tokens=tokens,
        min_new_tokens=tokens,
        rollout_buffer_size=len(data),
        eval_interval=0,
        seed=0,
        output_dir=out,
        verbose=False,  # the timed round prints nothing
    )
    return MAGRPOTrainer(
        agent_model=model_dir,
        formatters=list(FORMATTERS),
        reward_func=tasks.length_ratio_reward,
        train_dataset=data,
        args=config,
        peft_config=lora_config() if lora else None,
    )


def floor_models(model_dir: str, lora: bool) -> tuple[list, list[torch.optim.Optimizer]]:
    """Two full models and their AdamW, or one base with two adapters and one AdamW each."""
    if not lora:
        models = [AutoModelForCausalLM.from_pretrained(model_dir) for _ in FORMATTERS]
        return models, [torch.optim.AdamW(m.parameters(), lr=5e-6) for m in models]
    from peft import get_peft_model

    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir), lora_config(), ADAPTERS[0]
    )
    model.add_adapter(ADAPTERS[1], lora_config())
    params = [[p for n, p in model.named_parameters() if f".{a}." in n] for a in ADAPTERS]
    for group in params:
        for p in group:
            p.requires_grad_(True)  # set_adapter freezes the inactive adapter; each trains
    return [model], [torch.optim.AdamW(group, lr=1e-4) for group in params]


def round_meters() -> dict[str, RoundMeter]:
    """A meter per timed call, in process CPU seconds; generation is transformers' ``generate``
    in the floor and our agents' ``generate_rows`` in ours."""
    from transformers.generation.utils import GenerationMixin

    from cmlrl_agents import LLMAgent

    ours = [(LLMAgent, "generate_rows")]
    return {
        "floor": RoundMeter("cpu", [(GenerationMixin, "generate")], clock=time.process_time),
        "train": RoundMeter("cpu", ours, clock=time.process_time),
        "round": RoundMeter("cpu", ours, clock=time.process_time),
    }


def report_shares(peak: float, meters: dict[str, RoundMeter]) -> dict[str, dict]:
    """The share of the matmul peak per timed call, generation and update apart."""
    print(
        f"share of the fp32 matmul peak ({peak / 1e9:.1f} GFLOP per CPU second at "
        f"{torch.get_num_threads()} threads, this run; rounds and peak in process CPU seconds):"
    )
    shares = {}
    for name, meter in meters.items():
        shares[name] = meter.figures(peak)
        print(f"  {name:6s} {format_shares(shares[name], per='CPU s')}")
    return shares


def report(args: argparse.Namespace, times: dict[str, list[float]], best: dict[str, float]) -> None:
    print(
        f"{args.setup}: 2 agents, G=4, {args.items} items, {args.tokens} forced tokens, "
        f"{torch.get_num_threads()} threads, best of {args.repeats} (all: "
        + ", ".join(f"{k} {[round(v, 1) for v in vs]}" for k, vs in times.items())
        + ")"
    )
    cpu = {name: min(values) for name, values in CPU.items() if values}
    print(f"floor (transformers only)    {best['floor']:8.2f} s/round  (cpu {cpu['floor']:.2f} s)")
    for name, label in (("train", "train() of one round"), ("round", "collect_tree + update")):
        ratio, cpu_ratio = best[name] / best["floor"], cpu[name] / cpu["floor"]
        print(
            f"ours, {label:22s} {best[name]:8.2f} s  {ratio:.2f}x the floor  "
            f"(cpu {cpu[name]:.2f} s, {cpu_ratio:.2f}x)"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The best seconds of each timed call (``floor``, ``train``, ``round``) and, under
    ``share``, their share of the matmul peak (``benchmarks/peak.py``)."""
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    for values in CPU.values():  # a second main() in one process starts afresh
        values.clear()
    from cmlrl_agents import smollm2_path
    from cmlrl_agents.foundation.rollout import collect_tree

    model_dir = args.model or str(smollm2_path())
    torch.manual_seed(0)
    data = tasks.length_ratio_dataset().select([i % 10 for i in range(args.items)])
    items = [dict(row) for row in data]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    models, optimizers = floor_models(model_dir, args.setup == "lora")
    peak, meters = matmul_peak("cpu", torch.float32, clock=time.process_time), round_meters()
    with tempfile.TemporaryDirectory() as out:
        trainer = build_ours(model_dir, data, args.tokens, out, args.setup == "lora")
        times: dict[str, list[float]] = {"floor": [], "train": [], "round": []}

        def one_train() -> None:
            if trainer.epoch >= trainer.args.num_train_epochs:
                trainer.args.num_train_epochs += 1  # one more epoch of N items: one more round
            trainer.train()

        def one_round() -> None:
            pairs = [(item, i) for i, item in enumerate(items)]
            tree = collect_tree(
                trainer.env,
                trainer.agents,
                pairs,
                num_generations=4,
                sampling=trainer.agent_sampling,
                backend=trainer.generation_backend,
            )
            trainer.learner.update(trainer.learner.batch(tree))

        calls = {
            "floor": lambda: floor_round(models, optimizers, tokenizer, items, 4, args.tokens),
            "train": one_train,
            "round": one_round,
        }
        for _ in range(args.repeats):
            for name, call in calls.items():
                times[name].append(timed(lambda m=meters[name], c=call: m.time(c), name))
        for name, call in calls.items():  # after the timed rounds: counting slows every op
            meters[name].count(call)
        trainer.close()
    best = {name: min(values) for name, values in times.items()}
    report(args, times, best)
    return {**best, "share": report_shares(peak, meters)}


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
