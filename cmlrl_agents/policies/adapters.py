"""Adapter agents: one LoRA adapter per agent over ONE frozen base held once in memory.

``peft_config=LoraConfig(...)`` (TRL's keyword) on a trainer wraps each distinct base model once
with ``peft.get_peft_model`` and adds one adapter per agent on it, named after the agent
(``agent_0``, ``agent_1``, ...). ``agent_model="<one model>"`` loads that base once for the whole
team; ``agents=[model_a, model_b]`` gives each distinct model object its own adapters (the same
object twice is one shared base). Each agent's optimizer holds only its adapter's parameters, the
KL reference is the base with adapters disabled (``reference.BaseWithoutAdapters``), and a
checkpoint holds the adapters only (one file per shared base).
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.logprobs import Temperature
from cmlrl_agents.policies.model_setup import LOW_PRECISION, active_dropout
from cmlrl_agents.policies.reference import Reference, reference_logprobs
from cmlrl_agents.policies.sampling import Truncation
from cmlrl_agents.policies.tokens import TokenBatch, build_batch

if TYPE_CHECKING:
    from peft import PeftMixedModel, PeftModel

__all__ = [
    "JointPass",
    "adapter_parameters",
    "attach_adapters",
    "check_peft_config",
    "checkpoint_models",
    "is_peft_model",
    "joint_groups",
    "joint_pass",
    "same_device",
    "shared_groups",
    "step_groups",
]


def is_peft_model(model: Any) -> bool:
    """True for a ``peft.PeftModel`` (peft is only consulted when it is already imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def check_peft_config(peft_config: Any, num_agents: int) -> list[Any] | None:
    """One LoRA-like peft config per agent (a single config is used for every agent)."""
    if peft_config is None:
        return None
    configs = list(peft_config) if isinstance(peft_config, (list, tuple)) else None
    if configs is not None and len(configs) != num_agents:
        raise ValueError(
            f"peft_config is a list of {len(configs)} configs but there are {num_agents} agents; "
            "give one LoraConfig for every agent, or one per agent."
        )
    from peft import PeftConfig

    for i, config in enumerate(configs or [peft_config]):
        if not isinstance(config, PeftConfig) or config.is_prompt_learning:
            where = "peft_config" if configs is None else f"peft_config[{i}]"
            raise TypeError(
                f"{where} must be a peft adapter config such as peft.LoraConfig(r=8, "
                f"target_modules=[...]), got {type(config).__name__} {str(config)[:60]!r}."
            )
    # Copies: peft writes into the config it is given (base_model_name_or_path, ...).
    return [copy.deepcopy(c) for c in (configs or [peft_config] * num_agents)]


def attach_adapters(agents: Sequence[LLMAgent], configs: Sequence[Any]) -> list[LLMAgent]:
    """Agent i becomes adapter ``agent_i`` on its base model; agents whose ``model`` is the same
    object share one ``PeftModel`` (one base in memory)."""
    from peft import get_peft_model

    for i, agent in enumerate(agents):
        if is_peft_model(agent.model):
            raise ValueError(
                f"agents[{i}] is already a PeftModel ({type(agent.model).__name__}) and "
                "peft_config asks to add adapters; pass the plain base models with peft_config, "
                "or the PeftModels without peft_config."
            )
    wrapped: dict[int, PeftModel | PeftMixedModel] = {}
    out = []
    for i, (agent, config) in enumerate(zip(agents, configs, strict=True)):
        name = f"agent_{i}"
        key = id(agent.model)
        if key not in wrapped:
            if agent.loaded_dtype is not None:
                # LLMAgent cast the (then trainable) bf16/fp16 model to float32; the frozen base
                # goes back to the dtype it was loaded in, only the adapters are float32.
                agent.model.to(agent.loaded_dtype)
            for p in agent.model.parameters():
                p.requires_grad_(False)  # the base is frozen; only adapters train
            wrapped[key] = get_peft_model(agent.model, config, adapter_name=name)
        else:
            wrapped[key].add_adapter(name, config)
        model = wrapped[key]
        for p in adapter_parameters(model, name):
            if p.dtype in LOW_PRECISION:
                p.data = p.data.float()  # master weights (see model_setup.py)
        out.append(
            LLMAgent(
                model,
                agent.tokenizer,
                chat_template=agent.use_chat_template,
                system_prompt=agent.system_prompt,
                adapter=name,
            )
        )
    return out


def adapter_parameters(model: nn.Module, name: str) -> list[nn.Parameter]:
    """The parameters of adapter ``name`` (peft names them ``...lora_A.<name>.weight``)."""
    marker = f".{name}."
    return [p for n, p in model.named_parameters() if marker in n]


def shared_groups(agents: Sequence[LLMAgent]) -> list[list[int]]:
    """Indices of the adapter agents that share one base model, by first appearance."""
    groups: dict[int, list[int]] = {}
    for i, agent in enumerate(agents):
        if agent.adapter is not None:
            groups.setdefault(id(agent.model), []).append(i)
    return list(groups.values())


def joint_groups(agents: Sequence[LLMAgent]) -> list[list[int]]:
    """Shared bases whose agents can be scored in one mixed-adapter pass with gradients: peft
    allows per-row adapters in eval mode only, which equals training mode when no dropout is
    active (the trainers' ``disable_dropout`` default)."""
    return [
        g for g in shared_groups(agents) if len(g) > 1 and not active_dropout(agents[g[0]].model)
    ]


def step_groups(agents: Sequence[LLMAgent]) -> list[list[int]]:
    """The agents that step together, sorted (every rank reduces them in one order): adapter
    agents of one base without active dropout (one mixed-adapter pass), the others alone."""
    joint = joint_groups(agents)
    alone = [[a] for a in range(len(agents)) if not any(a in g for g in joint)]
    return sorted(joint + alone)


def checkpoint_models(agents: Sequence[LLMAgent]) -> dict[str, nn.Module]:
    """The models a checkpoint saves, by name: a fully trained agent as ``agent_i``, each shared
    base once as ``shared_base_k`` (its file then holds that base's adapters only)."""
    models: dict[str, nn.Module] = {}
    for i, agent in enumerate(agents):
        if agent.adapter is None:
            models[f"agent_{i}"] = agent.model
    for k, group in enumerate(shared_groups(agents)):
        models[f"shared_base_{k}"] = agents[group[0]].model
    return models


def same_device(agents: Sequence[LLMAgent], devices: Sequence[torch.device] | None) -> None:
    """Adapter agents on one base live where the base is: one device per shared base."""
    if devices is None:
        return
    for group in shared_groups(agents):
        placed = {str(devices[i]) for i in group}
        if len(placed) > 1:
            raise ValueError(
                f"agent_devices puts agents {group} on {sorted(placed)}, but they are adapters "
                "on one shared base held once in memory; give them one device, or pass one "
                "model per agent (agents=[...]) to place them apart."
            )


@dataclass(frozen=True)
class JointPass:
    """Rows of several agents scored together: ``logprobs[b]`` under row b's agent, and the
    reference's log-probs of the same rows (None without a reference)."""

    batch: TokenBatch
    logprobs: torch.Tensor
    reference: torch.Tensor | None
    owners: tuple[int, ...]
    """Per row: the position of its agent in the group that was scored."""
    entropy: torch.Tensor | None = None
    """Per token the policy's entropy (detached), when the pass was asked for it."""
    truncated_logprobs: torch.Tensor | None = None
    """Per token its log-prob under the rows' truncated sampling distribution (detached), when
    the pass was given their ``truncation``."""

    def rows(self, k: int) -> list[int]:
        """The rows of the group's ``k``-th agent."""
        return [i for i, owner in enumerate(self.owners) if owner == k]


def joint_pass(
    agents: Sequence[LLMAgent],
    owners: Sequence[int],
    prompt_ids: Sequence[Sequence[int]],
    completion_ids: Sequence[Sequence[int]],
    reference: Reference | None = None,
    *,
    policy_context: AbstractContextManager[Any] | None = None,
    prefix_sharing: bool = False,
    temperature: Temperature = 1.0,
    entropy: bool = False,
    truncation: Truncation | None = None,
) -> JointPass:
    """Score rows of ``agents`` (one agent, or adapter agents of one base from
    :func:`joint_groups`) in one policy forward, row b under ``agents[owners[b]]``: a plain pass
    for one agent, a mixed-adapter pass (peft's per-row ``adapter_names``) for several. The
    group's one ``reference`` (their base with adapters off, or one agent's frozen copy) reads
    the rows first, in its own pass; ``policy_context`` is entered around the policy forward
    only (a value head capturing the trunk's hidden states); ``prefix_sharing``,
    ``temperature`` (the rows' sampling temperature, one or one per row; the reference reads at
    it too), ``entropy`` and ``truncation`` go to :meth:`LLMAgent.score_tokens`."""
    lead = agents[0]
    batch = build_batch(prompt_ids, completion_ids, lead.pad_token_id).to(lead.device)
    ref = None
    if reference is not None:
        ref = reference_logprobs(reference, batch, temperature).to(lead.device)
    for agent in agents:
        # Leaving disable_adapter() (the reference pass) re-freezes every adapter but the
        # active one, and every adapter of a mixed pass trains.
        for p in agent.trainable_parameters():
            p.requires_grad_(True)
    names = None if len(agents) == 1 else [str(agents[k].adapter) for k in owners]
    with policy_context or nullcontext():
        scores = lead.score_tokens(
            batch,
            adapter_names=names,
            prefix_sharing=prefix_sharing,
            temperature=temperature,
            entropy=entropy,
            truncation=truncation,
        )
    return JointPass(
        batch=batch,
        logprobs=scores.logprobs,
        reference=ref,
        owners=tuple(owners),
        entropy=scores.entropy,
        truncated_logprobs=scores.truncated_logprobs,
    )
