"""A model-free policy for tests and demos: canned completions with made-up token ids.

Rollouts, trees, joint modes and their bookkeeping can be checked in milliseconds without a model;
the token ids are one id per character (``ord``), so they are deterministic and distinct.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from cmlrl_agents.policy import Completion, SamplingConfig

__all__ = ["ScriptedPolicy"]


class ScriptedPolicy:
    """``script(prompt, sample_index) -> completion text``; counts its ``generate`` calls."""

    def __init__(self, script: Callable[[str, int], str]) -> None:
        if not callable(script):
            raise TypeError(
                f"script must be callable (prompt, sample_index) -> str, got {script!r}."
            )
        self.script = script
        self.calls: list[tuple[list[str], int]] = []

    def generate(
        self, prompts: Sequence[str], num_samples: int = 1, sampling: SamplingConfig | None = None
    ) -> list[list[Completion]]:
        self.calls.append((list(prompts), num_samples))
        out = []
        for prompt in prompts:
            row = []
            for g in range(num_samples):
                text = self.script(prompt, g)
                if not isinstance(text, str):
                    raise TypeError(
                        f"script returned {type(text).__name__} for sample {g} of "
                        f"{prompt!r:.60}; it must return a str."
                    )
                row.append(
                    Completion(
                        text,
                        tuple(ord(c) for c in prompt) or (0,),
                        tuple(ord(c) for c in text),
                        True,
                    )
                )
            out.append(row)
        return out
