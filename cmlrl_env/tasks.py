"""The seed's example tasks (SPEC §8): length ratio (seed 000) and two-turn length feedback (002).

Used by the examples, the command line, the tests and the benchmarks. Each builder returns plain
pieces (dataset, formatters, reward, transition) so users can read and change them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset

__all__ = [
    "LENGTH_RATIO_PROMPTS",
    "length_ratio_dataset",
    "length_ratio_splits",
    "brief_formatter",
    "detailed_formatter",
    "length_ratio_reward",
    "feedback_dataset",
    "feedback_ratio_reward",
    "length_feedback",
]

LENGTH_RATIO_PROMPTS = (
    "Describe a city in the clouds.",
    "Invent a new holiday.",
    "Write a bedtime story for a dragon.",
    "Explain how teleportation might work.",
    "Tell a story about dinosaurs.",
    "Describe a world without electricity.",
    "Create a superhero with a unique power.",
    "Write a scene where the moon talks.",
    "Invent a new type of fruit.",
    "Design a playground on Mars.",
)


def length_ratio_dataset() -> Dataset:
    """The seed's 10 task items with ``target_min=2.0`` and ``target_max=3.0``."""
    n = len(LENGTH_RATIO_PROMPTS)
    return Dataset.from_dict(
        {"prompt": list(LENGTH_RATIO_PROMPTS), "target_min": [2.0] * n, "target_max": [3.0] * n}
    )


def length_ratio_splits() -> tuple[Dataset, Dataset]:
    """``train_test_split(test_size=0.2, seed=42)``: 8 training and 2 evaluation items."""
    split = length_ratio_dataset().train_test_split(test_size=0.2, seed=42)
    return split["train"], split["test"]


def brief_formatter(item: Mapping[str, Any]) -> str:
    return f"Write a short response to this task:\n{item['prompt']}"


def detailed_formatter(item: Mapping[str, Any]) -> str:
    return f"Write a detailed response to this task:\n{item['prompt']}"


def length_ratio_reward(
    brief_completions: Sequence[str],
    detailed_completions: Sequence[str],
    *,
    batch_items: Sequence[Mapping[str, Any]],
) -> list[float]:
    """``exp(-distance)`` of ``len(detailed) / len(brief)`` from ``[target_min, target_max]``."""
    item = batch_items[0]
    rewards = []
    for brief, detailed in zip(brief_completions, detailed_completions, strict=True):
        if not brief:
            rewards.append(0.0)
            continue
        ratio = len(detailed) / len(brief)
        distance = max(item["target_min"] - ratio, ratio - item["target_max"], 0.0)
        rewards.append(math.exp(-distance))
    return rewards


FEEDBACK_PROMPTS = (
    "Describe a city in the clouds:",
    "Invent a new holiday and explain it:",
    "Write a bedtime story for a dragon:",
    "Design a playground on Mars:",
)


def feedback_dataset() -> Dataset:
    """Seed 002's four task items."""
    return Dataset.from_dict({"prompt": list(FEEDBACK_PROMPTS)})


def feedback_ratio_reward(completions1: Sequence[str], completions2: Sequence[str]) -> list[float]:
    """Seed 002: ``exp(-distance)`` of the second answer's length ratio from ``[2, 3]``."""
    rewards = []
    for first, second in zip(completions1, completions2, strict=True):
        ratio = len(second) / max(len(first), 1)
        distance = 0.0 if 2 <= ratio <= 3 else min(abs(ratio - 2), abs(ratio - 3))
        rewards.append(math.exp(-distance))
    return rewards


def length_feedback(
    prompt: str, agent_completions: Sequence[str], num_agents: int, **history: Any
) -> list[str]:
    """Seed 002's transition: report each answer's length and the ratio, ask for a better one."""
    lengths = [len(text) for text in agent_completions]
    ratio = lengths[1] / max(lengths[0], 1)
    return [
        f"{prompt}\n\nYour last answer had {lengths[i]} characters. "
        f"The second answer was {ratio:.1f} times as long as the first; "
        "the goal is 2 to 3 times. Please write an improved answer."
        for i in range(num_agents)
    ]
