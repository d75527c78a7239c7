"""The floor: one MAGRPO round written directly with transformers, against one round of ours.

The floor is the least code that does one round's work: per agent one batched ``generate`` of
the N chat-templated prompts x G samples, the seed's length-ratio reward, group-normalised
advantages, one padded forward with gradients over the N x G sequences, backward, gradient
clipping and one AdamW step; no cmlrl code. Ours is ``MAGRPOTrainer`` with
``rollout_buffer_size = N``, so one ``train()`` of one epoch over the N items is one round.
Both force every completion to ``--tokens`` tokens (``min_new_tokens = max_new_tokens``) and
sample with our default settings, so they do the same work. They run alternately in one
process, ``--repeats`` times each; the best time of each is compared (the first round of each
pays one-time costs such as AdamW's state allocation).

    python benchmarks/floor.py                   # 2 agents, G=4, 4 items, 48 tokens, SmolLM2
    python benchmarks/floor.py --items 2 --tokens 16 --repeats 1

Prints the floor's seconds per round, ours (the whole ``train()`` call, and the round alone:
``collect_tree`` plus ``learner.update``) and the ratio to the floor (target: within 1.2x).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cmlrl_env import tasks

if TYPE_CHECKING:  # imported lazily: parsing the arguments needs no trainer
    from datasets import Dataset

    from cmlrl_agents import MAGRPOTrainer

FORMATTERS = (tasks.brief_formatter, tasks.detailed_formatter)
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_p": 0.6, "top_k": 50}  # our defaults


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
    sequences, texts = [], []
    for model, fmt in zip(models, FORMATTERS, strict=True):
        prompts = chat_ids(tokenizer, [fmt(item) for item in items])
        ids, mask = sample(model, tokenizer, prompts, g, tokens)
        sequences.append((ids, mask))
        texts.append(tokenizer.batch_decode(ids[:, -tokens:], skip_special_tokens=True))
    rows = [item for item in items for _ in range(g)]
    rewards = torch.tensor(tasks.length_ratio_reward(*texts, batch_items=rows)).view(-1, g)
    adv = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-8)
    for model, optimizer, (ids, mask) in zip(models, optimizers, sequences, strict=True):
        policy_step(model, optimizer, ids, mask, tokens, adv.reshape(-1))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=4, help="task items in the round (N)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", help="model folder (default: the local SmolLM2-135M-Instruct)")
    args = parser.parse_args(argv)
    for name in ("items", "tokens", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def build_ours(model_dir: str, data: Dataset, tokens: int, out: str) -> MAGRPOTrainer:
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
    )
    return MAGRPOTrainer(
        agent_model=model_dir,
        formatters=list(FORMATTERS),
        reward_func=tasks.length_ratio_reward,
        train_dataset=data,
        args=config,
    )


def report(args: argparse.Namespace, times: dict[str, list[float]], best: dict[str, float]) -> None:
    print(
        f"2 agents, G=4, {args.items} items, {args.tokens} forced tokens, "
        f"{torch.get_num_threads()} threads, best of {args.repeats} (all: "
        + ", ".join(f"{k} {[round(v, 1) for v in vs]}" for k, vs in times.items())
        + ")"
    )
    print(f"floor (transformers only)    {best['floor']:8.2f} s/round")
    for name, label in (("train", "train() of one round"), ("round", "collect_tree + update")):
        ratio = best[name] / best["floor"]
        print(f"ours, {label:22s} {best[name]:8.2f} s  {ratio:.2f}x the floor")


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    from cmlrl_agents import smollm2_path
    from cmlrl_agents.runs.rollout import collect_tree

    model_dir = args.model or str(smollm2_path())
    torch.manual_seed(0)
    data = tasks.length_ratio_dataset().select([i % 10 for i in range(args.items)])
    items = [dict(row) for row in data]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    models = [AutoModelForCausalLM.from_pretrained(model_dir) for _ in FORMATTERS]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=5e-6) for m in models]
    with tempfile.TemporaryDirectory() as out:
        trainer = build_ours(model_dir, data, args.tokens, out)
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
            trainer.learner.update(tree)

        for _ in range(args.repeats):
            times["floor"].append(
                timed(lambda: floor_round(models, optimizers, tokenizer, items, 4, args.tokens))
            )
            times["train"].append(timed(one_train))
            times["round"].append(timed(one_round))
        trainer.close()
    best = {name: min(values) for name, values in times.items()}
    report(args, times, best)
    return best


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
