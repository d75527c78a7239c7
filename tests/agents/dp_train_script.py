"""Run by tests/agents/test_data_parallel.py, in one process or under torch.distributed.run.

    python dp_train_script.py '{"out": "...", "family": "magrpo", "items": 8, ...}'

Trains a team of sampling tiny agents (real generation: each row draws from its sampling key,
so a launch samples what one process samples) with the trainer of ``family`` (magrpo, iac,
maac, centralized, madpo, marlhf) and writes ``params-rank<r>.pt`` (every trained weight) and
``metrics-rank<r>.json`` (the last metrics; with ``eval_items`` the final evaluation's metrics
and how many eval items this rank's reward function scored) into ``out``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset

from cmlrl_agents import (
    CentralizedMAGRPOConfig,
    CentralizedMAGRPOTrainer,
    IACConfig,
    IACTrainer,
    MAACConfig,
    MAACTrainer,
    MADPOConfig,
    MADPOTrainer,
    MAGRPOConfig,
    MAGRPOTrainer,
    MARLHFConfig,
    MARLHFTrainer,
    PreferenceRewardModel,
)
from cmlrl_agents.foundation.distributed import data_parallel
from cmlrl_agents.testing import tiny_agent, tiny_model, tiny_reward_model, tiny_tokenizer

CALLS = {"reward": 0}


def ratio_reward(c1: list[str], c2: list[str]) -> list[float]:
    CALLS["reward"] += 1  # once per item and turn
    ratios = [len(b) / max(len(a), 1) for a, b in zip(c1, c2, strict=True)]
    return [math.exp(-max(0.0, r - 3.0, 2.0 - r)) for r in ratios]


def eval_logger(*, agent_completions_turns, batch_items, prompts) -> list[dict[str, float]]:
    return [{"detailed_chars": float(len(turns[0]))} for turns in agent_completions_turns[1]]


def eval_aggregator(rows: list[dict[str, float]], *, num_turns: int) -> dict[str, float]:
    return {
        "detailed_chars": sum(r["detailed_chars"] for r in rows) / len(rows),
        "rows": float(len(rows)),
    }


def brief(item: dict[str, Any]) -> str:
    return f"Briefly: {item['prompt']}"


def detailed(item: dict[str, Any]) -> str:
    return f"In detail: {item['prompt']}"


SHARED = dict(
    max_new_tokens=5,
    eval_interval=0,
    logging_steps=1,
    agent_learning_rate=1e-2,
    seed=0,
    verbose=False,
    temperature=1.0,
    top_p=1.0,
    top_k=None,
)


def build(spec: dict[str, Any], out: Path) -> Any:
    family = spec.get("family", "magrpo")
    data = Dataset.from_dict({"prompt": [f"task {i * 7}" for i in range(spec["items"])]})
    team = {
        "agents": [tiny_agent(seed=0, eos_bias=3.0), tiny_agent(seed=1, eos_bias=1.0)],
        "formatters": [brief, detailed],
        "reward_func": ratio_reward,
        "train_dataset": data,
    }
    common = {
        **SHARED,
        "output_dir": str(out / "run"),
        "save_steps": spec.get("save_steps", 0),
        "num_train_epochs": spec.get("epochs", 1),
        "forward_batch_size": 4,
    }
    if family == "magrpo":
        args = MAGRPOConfig(
            **common,
            num_generations=2,
            rollout_buffer_size=4,
            loss_aggregation=spec.get("loss_aggregation", "token_mean"),
            advantage_normalization=spec.get("advantage_normalization", True),
            tree_plot_interval=spec.get("tree_plot_interval", 0),
        )
        num_eval = spec.get("eval_items", 0)
        if num_eval:  # evaluated at items 0 and 4 of the epoch, and once more at the end
            questions = Dataset.from_dict({"prompt": [f"q {i}" for i in range(num_eval)]})
            team.update(
                eval_dataset=questions, eval_logger=eval_logger, eval_aggregator=eval_aggregator
            )
            args.eval_interval, args.eval_num_samples, args.eval_batch_size = 4, num_eval, 2
        return MAGRPOTrainer(args=args, **team)
    if family in ("iac", "maac"):
        cls, config = (IACTrainer, IACConfig) if family == "iac" else (MAACTrainer, MAACConfig)
        args = config(**common, rollout_buffer_size=4, train_batch_size=2, ppo_clip_range=0.2)
        critics = [
            tiny_model(len(tiny_tokenizer()), 5 + c) for c in range(2 if family == "iac" else 1)
        ]
        return cls(args=args, critics=critics, tokenizer=tiny_tokenizer(), **team)
    if family == "centralized":
        args = CentralizedMAGRPOConfig(**common, num_generations=2, rollout_buffer_size=4)
        team["agents"] = team["agents"][:1]
        return CentralizedMAGRPOTrainer(args=args, **team)
    if family == "madpo":
        args = MADPOConfig(
            **common, preference_num_candidates=3, rollout_buffer_size=4, pair_batch_size=4
        )
        return MADPOTrainer(args=args, **team)
    tokenizer = tiny_tokenizer()
    rl = MAGRPOConfig(**{**common, "output_dir": None}, num_generations=2, rollout_buffer_size=4)
    args = MARLHFConfig(
        **common,
        rl_algorithm="magrpo",
        rl_args=rl,
        reward_learning_rate=1e-3,
        rollout_buffer_size=4,
    )
    model = PreferenceRewardModel(tiny_reward_model(len(tokenizer)), tokenizer, device="cpu")
    return MARLHFTrainer(args=args, reward_model=model, **team)


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    out = Path(spec["out"])
    trainer = build(spec, out)
    last = trainer.train(resume_from_checkpoint="latest" if spec.get("resume") else None)
    CALLS["reward"] = 0
    num_eval = spec.get("eval_items", 0)
    final = trainer.evaluate(num_eval_samples=num_eval) if num_eval else {}
    rank = data_parallel().rank
    params = {
        f"agent_{i}.{n}": p.detach()
        for i, a in enumerate(trainer.agents)
        for n, p in a.model.named_parameters()
        if p.requires_grad
    }
    torch.save(params, out / f"params-rank{rank}.pt")
    state = {
        "last": last,
        "env_step": trainer.env_step,
        "items_seen": trainer.items_seen,
        "world_size": data_parallel().world_size,
        "eval": final,
        "eval_reward_calls": CALLS["reward"],
    }
    (out / f"metrics-rank{rank}.json").write_text(json.dumps(state))
    trainer.close()
    if torch.distributed.is_initialized():
        # Leave the group together: a rank that exits while gloo's threads of the other still
        # run aborted once in about 20 launches ("terminate called without an active exception").
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
