"""``LLMJudge``: a local causal LM as the comparator of two joint responses (an LLM judge).

The judge reads the task and both joint responses and is scored, without sampling, on the
answers "A" and "B": ``log p("A") - log p("B")``. It judges both orders and takes the
difference, so a preference for whichever response comes first cancels and
``judge(a, b) == -judge(b, a)`` always. A remote judge is any callable of the same shape; its
client keeps its credentials (they never enter a config, a log or a checkpoint).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cmlrl_agents.policies.agent import LLMAgent

__all__ = ["DEFAULT_INSTRUCTION", "LLMJudge"]


def _instruction(labels: tuple[str, str]) -> str:
    return (
        "Two teams answered the same task. Which team's answer is better? "
        f"Reply with {labels[0]} or {labels[1]}."
    )


DEFAULT_INSTRUCTION = _instruction(("A", "B"))
"""The instruction with the default labels; other labels get it with theirs."""


def _joint_block(label: str, joint: Sequence[str]) -> str:
    lines = [f"Team {label}:"]
    lines += [f"Agent {a + 1}: {text}" for a, text in enumerate(joint)]
    return "\n".join(lines)


class LLMJudge:
    """``judge(joint_a, joint_b, item) -> 1 | 0 | -1`` from an :class:`LLMAgent`'s log-probs."""

    def __init__(
        self,
        agent: LLMAgent,
        *,
        instruction: str | None = None,
        labels: tuple[str, str] = ("A", "B"),
    ) -> None:
        """``instruction`` None: :data:`DEFAULT_INSTRUCTION`, naming ``labels`` as the replies."""
        if not isinstance(agent, LLMAgent):
            raise TypeError(
                f"agent must be an LLMAgent (e.g. LLMAgent.from_pretrained(path)), got "
                f"{type(agent).__name__}."
            )
        self.agent = agent
        self.instruction = _instruction(labels) if instruction is None else instruction
        self.labels = labels
        self.label_ids = [
            list(agent.tokenizer(label, add_special_tokens=False)["input_ids"]) for label in labels
        ]
        if not all(self.label_ids) or self.label_ids[0] == self.label_ids[1]:
            raise ValueError(
                f"labels={labels!r} must encode to two different non-empty token sequences."
            )

    def prompt(
        self, first: Sequence[str], second: Sequence[str], item: Mapping[str, Any] | None
    ) -> str:
        task = item.get("prompt") if item is not None else None
        parts = [self.instruction]
        if isinstance(task, str):
            parts.append(f"Task: {task}")
        parts += [_joint_block(self.labels[0], first), _joint_block(self.labels[1], second)]
        return "\n\n".join(parts)

    def _first_minus_second(self, prompts: list[str]) -> torch.Tensor:
        ids = self.agent.encode_prompts(prompts)
        rows = [ids[i] for i in range(len(prompts)) for _ in range(2)]
        answers = [self.label_ids[k] for _ in prompts for k in (0, 1)]
        with torch.no_grad():
            lp = self.agent.logprobs(rows, answers).sum(dim=1).reshape(len(prompts), 2)
        return lp[:, 0] - lp[:, 1]

    def margin(
        self, joint_a: Sequence[str], joint_b: Sequence[str], item: Mapping[str, Any] | None
    ) -> float:
        """How much more the judge prefers ``joint_a``: the A-minus-B log-prob gap with a shown
        first, minus the gap with b shown first."""
        gaps = self._first_minus_second(
            [self.prompt(joint_a, joint_b, item), self.prompt(joint_b, joint_a, item)]
        )
        return float(gaps[0] - gaps[1])

    def __call__(
        self, joint_a: Sequence[str], joint_b: Sequence[str], item: Mapping[str, Any] | None
    ) -> int:
        m = self.margin(joint_a, joint_b, item)
        return (m > 0) - (m < 0)
