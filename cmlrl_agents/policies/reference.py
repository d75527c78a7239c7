"""The frozen reference policy of the KL penalty, shared by every learner.

With ``reference_kl_enabled`` a learner keeps a frozen copy of each agent's initial weights (one
for the agents that start from the same weights) and
adds ``reference_kl_coef`` times the k3 estimate of KL(policy || reference) to the agent's loss
(TRL-style: a loss term, no extra policy forward). Adapter agents (``peft_config``) need no
copy: their reference is the shared base with its adapters disabled (:class:`BaseWithoutAdapters`).
The per-turn statistics are logged as ``turn_k/reference_kl_mean`` and
``turn_k/reference_kl_penalty_mean`` (SPEC §7).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from cmlrl_agents.policies.logprobs import Temperature, sequence_logprobs
from cmlrl_agents.policies.tokens import TokenBatch

__all__ = [
    "BaseWithoutAdapters",
    "reference_logprobs",
    "reference_policies",
]


class BaseWithoutAdapters:
    """The reference of adapter agents: their shared base with every adapter disabled
    (peft's ``disable_adapter()``), read in eval mode and without gradients; nothing is copied."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def logprobs(self, batch: TokenBatch, temperature: Temperature = 1.0) -> torch.Tensor:
        was_training = self.model.training
        self.model.eval()
        try:
            # A transformers/PEFT method, which nn.Module types as a Tensor | Module attribute.
            with torch.no_grad(), self.model.disable_adapter():  # type: ignore[operator]
                return sequence_logprobs(self.model, batch, temperature=temperature)
        finally:
            self.model.train(was_training)


Reference = torch.nn.Module | BaseWithoutAdapters


def reference_policies(agents: Sequence[Any], devices: Sequence[torch.device] | None) -> list[Any]:
    """Per agent its reference: the adapters' base (one per shared base, no copy) for an adapter
    agent, else a frozen copy of its model on ``devices[i]`` when given, one copy for all the
    agents whose initial weights are equal (and that would place it on the same device)."""
    if devices is not None and any(a.adapter is not None for a in agents):
        raise ValueError(
            f"reference_devices={[str(d) for d in devices]} places frozen reference copies, but "
            "adapter agents (peft_config) have none: their reference is the shared base with "
            "adapters disabled. Leave reference_devices unset."
        )
    bases: dict[int, BaseWithoutAdapters] = {}
    copies: list[torch.nn.Module] = []
    out: list[Any] = []
    for i, agent in enumerate(agents):
        if agent.adapter is not None:
            out.append(bases.setdefault(id(agent.model), BaseWithoutAdapters(agent.model)))
            continue
        device = None if devices is None else devices[i]
        # Agents that start from the same weights (a homogeneous team) share one frozen copy:
        # the reference is the initial policy, the same for all of them.
        ref = next((r for r in copies if _same_weights(agent.model, r, device)), None)
        if ref is None:
            ref = _frozen_copy(agent.model, device)
            copies.append(ref)
        out.append(ref)
    return out


def _same_weights(
    model: torch.nn.Module, ref: torch.nn.Module, device: torch.device | None
) -> bool:
    if type(model) is not type(ref):
        return False
    mine, theirs = model.state_dict(), ref.state_dict()
    if mine.keys() != theirs.keys():
        return False
    # Where this agent's own copy would be: ``device``, else where its model is.
    where = device if device is not None else next(model.parameters()).device
    if any(t.device != torch.device(where) for t in theirs.values()):
        return False
    return all(
        a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.to(b.device), b)
        for a, b in ((mine[k], theirs[k]) for k in mine)
    )


def _frozen_copy(model: torch.nn.Module, device: torch.device | None) -> torch.nn.Module:
    # Copied where the model is, then moved device to device (never through the CPU).
    ref = copy.deepcopy(model).eval()
    if device is not None:
        ref.to(device)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def reference_logprobs(
    reference: Reference, batch: TokenBatch, temperature: Temperature = 1.0
) -> torch.Tensor:
    """``[B, L]`` token log-probs of ``batch`` under the frozen reference at ``temperature``
    (no gradient), on the reference's device: the one place the learners read the reference."""
    if isinstance(reference, BaseWithoutAdapters):
        return reference.logprobs(batch, temperature)
    with torch.no_grad():
        ref_device = next(reference.parameters()).device
        temps = temperature.to(ref_device) if isinstance(temperature, torch.Tensor) else temperature
        return sequence_logprobs(reference, batch.to(ref_device), temperature=temps)
