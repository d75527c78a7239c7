"""Sampling from bfloat16 copies of the agents (``generation_backend="hf_bf16"``).

A decoding step reads every weight once for a handful of rows, so on a CPU it is bound by
memory, not by arithmetic: a SmolLM2-135M step of 8 rows took 108 ms from float32 weights and
59 ms from bfloat16 ones (docs/benchmarks.md). This backend keeps one bfloat16 copy of each
distinct agent model (adapter agents on one base share one), samples from it with transformers'
``generate`` exactly as :class:`~cmlrl_agents.policies.generation.HFGenerate` does, and copies
the trained weights into it at every ``sync``. The float32 model stays what the optimizer steps
and what the loss scores.

The copy's distribution differs from the trainer's by bfloat16's rounding, so its completions
carry the sampler's log-prob of each token (``Completion.sampler_logprobs``), and the learners
weight each token's policy term by the truncated importance ratio ``min(pi_trainer /
pi_sampler, tis_cap)``, as they do for vLLM. Evaluation samples from the copy too.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from cmlrl_agents.policies.agent import Completion, LLMAgent
from cmlrl_agents.policies.generation import GenerationRequest, HFGenerate

__all__ = ["BF16Generate"]


class BF16Generate:
    """transformers' ``generate`` on a bfloat16 copy of each agent's model."""

    def __init__(self) -> None:
        self._inner = HFGenerate()
        self._copies: dict[int, tuple[nn.Module, nn.Module]] = {}  # id(model): (model, copy)
        self._views: dict[int, tuple[LLMAgent, LLMAgent]] = {}  # id(agent): (agent, its view)

    def generate(
        self, agents: Sequence[Any], requests: Sequence[GenerationRequest]
    ) -> list[list[list[Completion]]]:
        return self._inner.generate([self._view(i, a) for i, a in enumerate(agents)], requests)

    def sync(self, agents: Sequence[Any]) -> None:
        """Copy every trainable weight into its bfloat16 copy (frozen ones never change)."""
        with torch.no_grad():
            for model, low in self._copies.values():
                low_params = dict(low.named_parameters())
                for name, param in model.named_parameters():
                    if param.requires_grad:
                        low_params[name].copy_(param)

    def _view(self, index: int, agent: Any) -> LLMAgent:
        if not isinstance(agent, LLMAgent):
            raise TypeError(
                f"generation_backend='hf_bf16' samples from bfloat16 copies of LLM agents, and "
                f"agents[{index}] is a {type(agent).__name__}; use generation_backend='hf'."
            )
        low = self._low(agent.model)
        entry = self._views.get(id(agent))
        if entry is None or entry[0] is not agent or entry[1].model is not low:
            view = copy.copy(agent)  # shares the tokenizer, chat format, adapter name
            view.model = low
            view.reports_sampler_logprobs = True
            entry = self._views[id(agent)] = (agent, view)
        return entry[1]

    def _low(self, model: nn.Module) -> nn.Module:
        """The bfloat16 copy of ``model``, made at its first use."""
        entry = self._copies.get(id(model))
        if entry is None or entry[0] is not model:
            low = copy.deepcopy(model).to(torch.bfloat16).requires_grad_(False)
            entry = self._copies[id(model)] = (model, low)
        return entry[1]
