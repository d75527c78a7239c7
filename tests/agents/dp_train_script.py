"""Run by tests/agents/test_data_parallel.py, in one process or under torch.distributed.run.

    python dp_train_script.py '{"out": "...", "items": 8, "resume": false, ...}'

Trains two scripted agents (real tiny models answering scripted texts: generation is
deterministic) and writes ``params-rank<r>.pt`` (every agent's weights) and
``metrics-rank<r>.json`` (the last round's metrics; with ``eval_items`` the final evaluation's
metrics and how many eval items this rank's reward function scored) into ``out``.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from datasets import Dataset

from cmlrl_agents import MAGRPOConfig, MAGRPOTrainer
from cmlrl_agents.policies.scripted import ScriptedLLMAgent
from cmlrl_agents.runs.distributed import data_parallel
from cmlrl_agents.testing import tiny_model, tiny_tokenizer

WORDS = ("sun", "rain over the hills", "a", "wind and snow", "grey sky at noon")


def brief(prompt: str, g: int) -> str:
    return WORDS[(len(prompt) + g) % len(WORDS)]


def detailed(prompt: str, g: int) -> str:
    return " ".join(WORDS[: 1 + (prompt.count("7") + 2 * g + len(prompt)) % len(WORDS)])


CALLS = {"reward": 0}


def ratio_reward(c1: list[str], c2: list[str]) -> list[float]:
    CALLS["reward"] += 1  # once per item and turn (SPEC §4)
    ratios = [len(b) / max(len(a), 1) for a, b in zip(c1, c2, strict=True)]
    return [math.exp(-max(0.0, r - 3.0, 2.0 - r)) for r in ratios]


def eval_logger(*, agent_completions_turns, batch_items, prompts) -> list[dict[str, float]]:
    return [{"detailed_chars": float(len(turns[0]))} for turns in agent_completions_turns[1]]


def eval_aggregator(rows: list[dict[str, float]], *, num_turns: int) -> dict[str, float]:
    return {"detailed_chars": sum(r["detailed_chars"] for r in rows) / len(rows),
            "rows": float(len(rows))}  # fmt: skip


def main() -> None:
    spec = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    out = Path(spec["out"])
    tokenizer = tiny_tokenizer()
    agents = [
        ScriptedLLMAgent(script, tiny_model(len(tokenizer), seed), tokenizer)
        for seed, script in enumerate((brief, detailed))
    ]
    args = MAGRPOConfig(
        num_generations=2, rollout_buffer_size=4, forward_batch_size=4, eval_interval=0,
        logging_steps=1, agent_learning_rate=1e-2, seed=0, output_dir=str(out / "run"),
        save_steps=spec.get("save_steps", 0), num_train_epochs=spec.get("epochs", 1),
        loss_aggregation=spec.get("loss_aggregation", "token_mean"), verbose=False,
        prefix_sharing=spec.get("prefix_sharing", True),
    )  # fmt: skip
    data = Dataset.from_dict({"prompt": [f"task {i * 7}" for i in range(spec["items"])]})
    num_eval = spec.get("eval_items", 0)
    evals = {}
    if num_eval:  # evaluated at items 0 and 4 of the epoch, and once more at the end
        evals = {"eval_dataset": Dataset.from_dict({"prompt": [f"q {i}" for i in range(num_eval)]}),
                 "eval_logger": eval_logger, "eval_aggregator": eval_aggregator}  # fmt: skip
        args.eval_interval, args.eval_num_samples, args.eval_batch_size = 4, num_eval, 2
    trainer = MAGRPOTrainer(
        agents=agents, reward_func=ratio_reward, train_dataset=data, args=args, **evals
    )
    last = trainer.train(resume_from_checkpoint="latest" if spec.get("resume") else None)
    CALLS["reward"] = 0
    final = trainer.evaluate(num_eval_samples=num_eval) if num_eval else {}
    rank = data_parallel().rank
    params = {f"agent_{i}.{n}": p.detach() for i, a in enumerate(agents)
              for n, p in a.model.named_parameters()}  # fmt: skip
    torch.save(params, out / f"params-rank{rank}.pt")
    state = {"last": last, "env_step": trainer.env_step, "items_seen": trainer.items_seen,
             "world_size": data_parallel().world_size, "eval": final,
             "eval_reward_calls": CALLS["reward"]}  # fmt: skip
    (out / f"metrics-rank{rank}.json").write_text(json.dumps(state))
    trainer.close()


if __name__ == "__main__":
    main()
