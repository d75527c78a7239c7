"""Scripted policies for tests and demos: canned completions instead of sampling.

``ScriptedPolicy`` needs no model: rollouts, trees, joint modes and their bookkeeping can be
checked in milliseconds; its token ids are one id per character (``ord``), deterministic and
distinct. ``ScriptedLLMAgent`` keeps a real model (so trainers can score and update it) but
answers with the script, which makes a training round computable by hand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cmlrl_agents.policies.agent import Completion, LLMAgent, SamplingConfig

__all__ = ["ScriptedLLMAgent", "ScriptedPolicy"]


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
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        sampling: SamplingConfig | None = None,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """The scripted texts (``sampling`` and the sampling ``keys`` have nothing to draw)."""
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


class ScriptedLLMAgent(LLMAgent):
    """An :class:`LLMAgent` whose answers are scripted while its model is real.

    ``generate`` returns ``script(prompt, sample_index)`` as the completion, tokenized by the
    agent's own tokenizer and ended with EOS, so a trainer scores and updates the model on
    texts the reader chose: every reward, return, advantage and loss of a round can then be
    worked out by hand (``examples/notebooks/02_magrpo_by_hand.ipynb``). The model still
    learns; only sampling is replaced.
    """

    def __init__(
        self, script: Callable[[str, int], str], model: Any, tokenizer: Any, **agent_kwargs: Any
    ) -> None:
        super().__init__(model, tokenizer, **agent_kwargs)
        self.policy = ScriptedPolicy(script)

    def generate_texts(self, prompts: Sequence[str], num_samples: int) -> list[list[str]]:
        """The scripted texts, ``[prompt][sample]``."""
        return [[c.text for c in row] for row in self.policy.generate(list(prompts), num_samples)]

    def generate(
        self,
        prompts: Sequence[str],
        num_samples: int = 1,
        sampling: SamplingConfig | None = None,
        keys: Sequence[int] | None = None,
    ) -> list[list[Completion]]:
        """The scripted texts as the model's tokens (nothing is sampled: ``keys`` unused)."""
        prompt_ids = self.encode_prompts(prompts)
        eos = self.tokenizer.eos_token_id
        eos = min(self.eos_token_ids) if eos is None else eos
        out = []
        for ids, texts in zip(prompt_ids, self.generate_texts(prompts, num_samples), strict=True):
            row = []
            for text in texts:
                completion = self.tokenizer(text, add_special_tokens=False)["input_ids"]
                row.append(Completion(text, tuple(ids), (*completion, eos), True))
            out.append(row)
        return out
