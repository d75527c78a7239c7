"""What one agent's rows of a scored pass cost: the policy loss and a value head's loss.

:class:`PolicyObjective` is the loss settings a learner's config gives. :func:`agent_loss` is
:func:`~cmlrl_agents.functional.losses.policy_token_losses` over an agent's scored rows
(:class:`AgentRows`), aggregated over the step's totals, so forward chunks and ranks change
nothing:

* rows sampled before the policy moved (a round of several optimizer steps) carry their
  log-probs from before the round's first step (:class:`OldScores`), and their term is PPO's
  clipped ratio to them;
* rows a separate sampler drew (vLLM) are weighted by the truncated importance ratio of the
  trainer's to the sampler's probabilities (``tis_cap``);
* the k3 KL to the reference is added per token.

A value head on the actor (actor-critic with ``use_separate_critic=False``) reads the trunk
during the same forward; :func:`head_loss` is its value loss. Planning and scoring the step is
:mod:`cmlrl_agents.learning.policy_step`.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from cmlrl_agents.foundation.config import SEPARATE_SAMPLERS, SharedConfig
from cmlrl_agents.functional.losses import (
    aggregate,
    kl_k3_tokens,
    policy_token_losses,
    ratio_stats,
    truncated_is_weights,
    value_loss,
)
from cmlrl_agents.learning.batch import PolicyRow
from cmlrl_agents.policies.adapters import JointPass

__all__ = [
    "AgentRows",
    "OldScores",
    "PolicyObjective",
    "agent_loss",
    "head_loss",
    "record_old_scores",
]


@dataclass(frozen=True)
class PolicyObjective:
    """How a learner's config turns scored rows into each agent's loss."""

    aggregation: str
    temperatures: tuple[float, ...]
    """Each agent's sampling temperature (all agents, in team order)."""
    kl_coef: float = 0.0
    clip_range: float | None = None
    """PPO's clip of the ratio to the rows' log-probs before the round (stale rows only)."""
    tis_cap: float | None = None
    """None: the sampler is the trainer's model; else rows carry the sampler's log-probs."""
    truncations: tuple[tuple[int | None, float], ...] = ()
    """Each agent's ``(top_k, top_p)``: with ``tis_cap``, the trainer's log-probs that the
    sampler's are compared with are those of the same truncated distribution."""
    prefix_sharing: bool = False
    entropy: bool = True
    value_loss_coef: float = 0.0
    value_clip_range: float | None = None

    @classmethod
    def of(
        cls,
        args: SharedConfig,
        num_agents: int,
        *,
        kl_coef: float | None,
        clip_range: float | None,
        **settings: Any,
    ) -> PolicyObjective:
        """The objective of a config: every agent's sampling temperature, the KL term when the
        learner has references (``kl_coef`` None: none), truncated importance weights when a
        separate sampler draws (vLLM, bfloat16 copies); ``settings`` sets the other fields."""
        sampling = [args.sampling_for(a) for a in range(num_agents)]
        return cls(
            temperatures=tuple(s.temperature for s in sampling),
            truncations=tuple((s.top_k, s.top_p) for s in sampling),
            kl_coef=0.0 if kl_coef is None else kl_coef,
            clip_range=clip_range,
            tis_cap=args.tis_cap if args.generation_backend in SEPARATE_SAMPLERS else None,
            entropy=args.log_entropy,
            **settings,
        )


class AgentRows:
    """One agent's rows of a scored chunk: positions ``mine`` of the pass, batch indices."""

    def __init__(
        self, scored: JointPass, mine: list[int], indices: list[int], rows: Sequence[PolicyRow]
    ) -> None:
        everything = len(mine) == len(scored.owners)
        device = scored.logprobs.device
        # Alone (every row its own), the tensors are used as they are: no gathered copy.
        self.selector: slice | Tensor = (
            slice(None) if everything else torch.tensor(mine, device=device)
        )
        self.indices = indices
        self.picked = [rows[i] for i in indices]
        self.logprobs = scored.logprobs[self.selector]
        self.mask = scored.batch.completion_mask[self.selector].bool()
        self.reference = None if scored.reference is None else scored.reference[self.selector]
        self.entropy = None if scored.entropy is None else scored.entropy[self.selector]
        truncated = scored.truncated_logprobs
        self.truncated_logprobs = None if truncated is None else truncated[self.selector]


@dataclass(frozen=True)
class OldScores:
    """A stale row's completion log-probs from before the round, and (with a separate sampler)
    its log-probs under the truncated sampling distribution then."""

    logprobs: Tensor
    truncated_logprobs: Tensor | None = None

    def truncated(self) -> Tensor:
        if self.truncated_logprobs is None:
            raise ValueError("these old scores were taken without the sampler's truncation")
        return self.truncated_logprobs


def agent_loss(
    objective: PolicyObjective,
    a: int,
    ctx: AgentRows,
    totals: Mapping[str, float],
    old: MutableMapping[int, OldScores] | None,
    sums: dict[str, Tensor],
    maxima: dict[str, Tensor],
    *,
    record_old: bool = False,
) -> Tensor:
    """Agent ``a``'s policy loss on its rows of a scored chunk (``ctx``), aggregated over the
    step's ``totals``; its statistics go into ``sums`` and ``maxima`` under the step's keys.

    ``record_old``: the chunk was scored on the weights that sampled (the round's first step),
    so its log-probs become the rows' ``old`` ones, with no pass of their own."""
    obj = objective
    lp, mask = ctx.logprobs, ctx.mask
    if old is not None and record_old:
        record_old_scores(old, ctx)
    adv = torch.tensor([r.advantage for r in ctx.picked], device=lp.device, dtype=lp.dtype)
    old_lp = None if old is None else _placed([old[i].logprobs for i in ctx.indices], mask)
    weights = None if obj.tis_cap is None else _sampler_weights(obj, a, ctx, old, sums, maxima)
    per_token = policy_token_losses(
        lp,
        mask,
        adv,
        old_logprobs=old_lp,
        clip_range=obj.clip_range if old_lp is not None else None,
        is_weights=weights,
        ref_logprobs=ctx.reference,
        kl_coef=obj.kl_coef,
        check=False,
    )
    loss = aggregate(
        per_token,
        mask,
        obj.aggregation,
        num_sequences=totals[f"agent_{a}/samples"],
        num_tokens=max(totals[f"agent_{a}/tokens"], 1.0),
    )
    sums[f"agent_{a}/loss"] = loss.detach()
    _diagnostics(obj, a, ctx, old_lp, sums, maxima)
    return loss


def _sampler_weights(
    obj: PolicyObjective,
    a: int,
    ctx: AgentRows,
    old: Mapping[int, OldScores] | None,
    sums: dict[str, Tensor],
    maxima: dict[str, Tensor],
) -> Tensor:
    """The truncated importance weights of rows a separate sampler drew (``tis_cap``)."""
    assert obj.tis_cap is not None
    mask = ctx.mask
    sampler = [torch.tensor(r.sampler_logprobs or (), device=mask.device) for r in ctx.picked]
    # The trainer's probability of each token under the sampler's own truncated
    # distribution, at the weights that sampled (before the round when it is stale).
    if old is None:
        assert ctx.truncated_logprobs is not None, "score() passes the truncation"
        base = ctx.truncated_logprobs
    else:
        base = _placed([old[i].truncated() for i in ctx.indices], mask)
    weights = truncated_is_weights(base, _placed(sampler, mask), mask, obj.tis_cap)
    sums[f"agent_{a}/is_weight_sum"] = torch.where(mask, weights, 0.0).sum()
    maxima[f"agent_{a}/is_weight_max"] = torch.where(mask, weights, 0.0).max()
    return weights


def _diagnostics(
    obj: PolicyObjective,
    a: int,
    ctx: AgentRows,
    old_lp: Tensor | None,
    sums: dict[str, Tensor],
    maxima: dict[str, Tensor],
) -> None:
    """The step's KL per turn, entropy and ratio statistics of the agent's rows (no gradient
    flows through any of them)."""
    lp, mask, ref = ctx.logprobs, ctx.mask, ctx.reference
    if ref is not None:
        kl = kl_k3_tokens(lp.detach(), ref, mask, check=False).sum(dim=1)
        for turn in {r.turn for r in ctx.picked}:
            idx = [j for j, r in enumerate(ctx.picked) if r.turn == turn]
            sums[f"agent_{a}/turn_{turn}/kl_sum"] = kl[torch.tensor(idx, device=lp.device)].sum()
    if ctx.entropy is not None:
        sums[f"agent_{a}/entropy_sum"] = torch.where(mask, ctx.entropy, 0.0).sum()
    if old_lp is not None and obj.clip_range is not None:
        stats = ratio_stats(lp, old_lp, mask, obj.clip_range)
        for key in ("ratio_sum", "clipped", "approx_kl_sum"):
            sums[f"agent_{a}/{key}"] = stats[key]
        maxima[f"agent_{a}/ratio_max"] = stats["ratio_max"]


def head_loss(
    objective: PolicyObjective,
    a: int,
    ctx: AgentRows,
    values: Tensor,
    totals: Mapping[str, float],
    sums: dict[str, Tensor],
) -> Tensor:
    """The head's value loss of the agent's rows (``values``), a mean over the step's
    samples, times ``value_loss_coef``."""
    obj, picked = objective, ctx.picked
    if any(r.value_target is None or r.value_old is None for r in picked):
        raise ValueError(
            f"agent_{a} has a value head, but some of its rows carry no value target; build "
            "the batch with the actor-critic learner's batch(tree)."
        )
    device = values.device
    targets = torch.tensor([r.value_target for r in picked], device=device)
    previous = None
    if obj.value_clip_range is not None:
        previous = torch.tensor([r.value_old for r in picked], device=device)
    loss = value_loss(values, targets, previous, obj.value_clip_range, check=False)
    loss = loss * (len(picked) / totals[f"agent_{a}/samples"])
    sums[f"agent_{a}/value_loss"] = loss.detach()
    return obj.value_loss_coef * loss


def record_old_scores(old: MutableMapping[int, OldScores], ctx: AgentRows) -> None:
    """Put each of ``ctx``'s rows' current log-probs (detached) into ``old``."""
    truncated = ctx.truncated_logprobs
    for b, i in enumerate(ctx.indices):
        if i in old:
            raise ValueError(f"row {i} already has old log-probs; a round records them once")
        m = ctx.mask[b]
        old[i] = OldScores(
            logprobs=ctx.logprobs[b][m].detach(),
            truncated_logprobs=None if truncated is None else truncated[b][m].detach(),
        )


def _placed(values: Sequence[Tensor], mask: Tensor) -> Tensor:
    """Per row its completion tokens' values (1-D each) put at the row's mask positions."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    out[mask] = torch.cat([v.to(mask.device, torch.float32) for v in values])
    return out
