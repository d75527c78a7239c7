"""Generation backends: how a tree level's prompts become completions.

A backend takes one level's requests (per agent: its open branches' prompts, G, its sampling
settings) and returns ``completions[request][prompt][sample]``; after each update the trainer
calls ``backend.sync(agents)`` so that a backend holding its own copy of the weights (vLLM)
serves the updated policy. :class:`HFGenerate` (transformers' ``generate``) is the default;
``cmlrl_agents.policies.vllm_backend.VLLMGenerate`` is the optional vLLM one (``pip install
cmlrl[vllm]``), imported only when chosen (``policies/backends.py``: the one a config names).

:class:`HFGenerate` makes ONE ``generate`` call for all adapter agents on one shared base whose
sampling settings are equal (peft's per-row ``adapter_names``); rows with different settings
(temperature, top_p, top_k, max_new_tokens, min_new_tokens) cannot share one Hugging Face call, so
they are grouped by settings: one call per distinct setting and base. Agents with models of their
own make one call each.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from cmlrl_agents.policies.agent import Completion, LLMAgent, SamplingConfig

__all__ = ["GenerationBackend", "GenerationRequest", "HFGenerate"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationRequest:
    """Agent ``agent`` answers each of ``prompts`` ``num_samples`` times with ``sampling``."""

    agent: int
    prompts: Sequence[str]
    num_samples: int
    sampling: SamplingConfig
    keys: Sequence[int] | None = None
    """One sampling key per prompt and sample (prompt-major), or None: the global generator."""


@runtime_checkable
class GenerationBackend(Protocol):
    """Prompts in, completions out; ``sync`` after every update of the agents' weights."""

    def generate(
        self, agents: Sequence[Any], requests: Sequence[GenerationRequest]
    ) -> list[list[list[Completion]]]: ...

    def sync(self, agents: Sequence[Any]) -> None: ...


class HFGenerate:
    """transformers' ``generate`` on each agent's own device (the default backend)."""

    def __init__(self) -> None:
        self._told: set[int] = set()

    def generate(
        self, agents: Sequence[Any], requests: Sequence[GenerationRequest]
    ) -> list[list[list[Completion]]]:
        out: list[list[list[Completion]] | None] = [None] * len(requests)
        for group in self._groups(agents, requests):
            if len(group) == 1:
                r = requests[group[0]]
                # Keys only when given: a policy written for collect_tree without them works.
                keys = {} if r.keys is None else {"keys": r.keys}
                out[group[0]] = agents[r.agent].generate(
                    list(r.prompts), r.num_samples, r.sampling, **keys
                )
                continue
            for index, completions in zip(group, _one_call(agents, requests, group), strict=True):
                out[index] = completions
        return out  # type: ignore[return-value]  # the loop filled every request's slot

    def sync(self, agents: Sequence[Any]) -> None:
        """Nothing to do: ``generate`` reads the live weights."""

    def _groups(
        self, agents: Sequence[Any], requests: Sequence[GenerationRequest]
    ) -> list[list[int]]:
        """Request indices that share one ``generate`` call: adapter agents of one base (and
        tokenizer) with equal sampling settings; every other request alone."""
        groups: dict[Any, list[int]] = {}
        settings: dict[int, set[SamplingConfig]] = {}
        for i, r in enumerate(requests):
            agent = agents[r.agent]
            if isinstance(agent, LLMAgent) and agent.adapter is not None:
                base = id(agent.model)
                key: Any = (base, id(agent.tokenizer), r.sampling)
                settings.setdefault(base, set()).add(r.sampling)
            else:
                key = ("alone", i)
            groups.setdefault(key, []).append(i)
        for base, distinct in settings.items():
            if len(distinct) > 1 and base not in self._told:
                self._told.add(base)
                logger.info(
                    "adapter agents on one base have %d different sampling settings; rows with "
                    "different settings cannot share one generate call, so each setting takes "
                    "its own call",
                    len(distinct),
                )
        return list(groups.values())


def _one_call(
    agents: Sequence[Any], requests: Sequence[GenerationRequest], group: list[int]
) -> list[list[list[Completion]]]:
    """One mixed-adapter ``generate`` over every row of ``group`` (rows in request order)."""
    rows: list[list[int]] = []
    names: list[str] = []
    keys: list[int] | None = []
    sizes = []
    for i in group:
        r = requests[i]
        agent = agents[r.agent]
        ids = agent.encode_prompts(list(r.prompts))
        rows.extend(list(p) for p in ids for _ in range(r.num_samples))
        names.extend([agent.adapter] * (len(ids) * r.num_samples))
        sizes.append((len(ids), r.num_samples))
        keys = None if keys is None or r.keys is None else [*keys, *r.keys]
    first = agents[requests[group[0]].agent]
    flat = first.generate_rows(rows, requests[group[0]].sampling, adapter_names=names, keys=keys)
    out, start = [], 0
    for prompts, g in sizes:
        block = flat[start : start + prompts * g]
        out.append([block[p * g : (p + 1) * g] for p in range(prompts)])
        start += prompts * g
    return out
