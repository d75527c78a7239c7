"""The policy part of an optimizer step, shared by the MAGRPO family and the actor-critics.

A step's policy rows are scored by group: the adapter agents of one base together in one
mixed-adapter pass (``adapters.joint_pass``), any other agent as a group of one. Each agent's
loss is :func:`~cmlrl_agents.functional.losses.policy_token_losses` aggregated over the step's
totals, so forward chunks and ranks change nothing:

* log-probs are scored at the agent's sampling temperature (the tempered distribution the
  sampler drew from, before top-k/top-p truncation, as TRL does);
* rows sampled before the policy moved (a round of several optimizer steps) carry their
  log-probs from before the round's first step, and their term is PPO's clipped ratio to them;
* rows a separate sampler drew (vLLM) are weighted by the truncated importance ratio of the
  trainer's to the sampler's probabilities (``tis_cap``);
* the k3 KL to the reference is added per token.

A value head on the actor (actor-critic with ``use_separate_critic=False``) reads the trunk
during the same forward and adds its value loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from cmlrl_agents.foundation.config import SharedConfig
from cmlrl_agents.functional.losses import (
    aggregate,
    kl_k3_tokens,
    policy_token_losses,
    ratio_stats,
    truncated_is_weights,
    value_loss,
)
from cmlrl_agents.learning.batch import PolicyRow
from cmlrl_agents.learning.engine import ChunkLoss, StepPlan
from cmlrl_agents.policies.adapters import JointPass, joint_pass
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.logprobs import Temperature
from cmlrl_agents.policies.reference import Reference
from cmlrl_agents.policies.sampling import Truncation
from cmlrl_agents.policies.value_head import HeadCaptures, ValueModel

__all__ = ["OldScores", "PolicyObjective", "PolicyStep"]

Entry = tuple[int, int]
"""``(k, i)``: row ``i`` of the batch, of the group's ``k``-th agent."""


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
        learner has references (``kl_coef`` None: none), truncated importance weights when vLLM
        samples; ``settings`` sets the other fields."""
        sampling = [args.sampling_for(a) for a in range(num_agents)]
        return cls(
            temperatures=tuple(s.temperature for s in sampling),
            truncations=tuple((s.top_k, s.top_p) for s in sampling),
            kl_coef=0.0 if kl_coef is None else kl_coef,
            clip_range=clip_range,
            tis_cap=args.tis_cap if args.generation_backend == "vllm" else None,
            entropy=args.log_entropy,
            **settings,
        )


class PolicyStep:
    """Plans the policy part of a step for one group of agents over a round's rows."""

    def __init__(
        self,
        agents: Sequence[LLMAgent],
        references: Sequence[Reference] | None,
        objective: PolicyObjective,
        num_turns: int,
    ) -> None:
        self.agents = list(agents)
        self.references = references
        self.objective = objective
        self.num_turns = num_turns

    # -- the keys every rank declares -------------------------------------------------------------
    def count_keys(self, group: Sequence[int]) -> list[str]:
        keys = []
        for a in group:
            keys += [f"agent_{a}/samples", f"agent_{a}/tokens"]
            keys += [f"agent_{a}/turn_{t}/samples" for t in range(1, self.num_turns + 1)]
        return keys

    def sum_keys(self, group: Sequence[int], stale: bool, heads: bool) -> list[str]:
        keys = []
        for a in group:
            keys.append(f"agent_{a}/loss")
            if self.references is not None:
                keys += [f"agent_{a}/turn_{t}/kl_sum" for t in range(1, self.num_turns + 1)]
            if self.objective.entropy:
                keys.append(f"agent_{a}/entropy_sum")
            if stale:
                keys += [f"agent_{a}/{k}" for k in ("ratio_sum", "clipped", "approx_kl_sum")]
            if self.objective.tis_cap is not None:
                keys.append(f"agent_{a}/is_weight_sum")
            if heads:
                keys.append(f"agent_{a}/value_loss")
        return keys

    def max_keys(self, group: Sequence[int], stale: bool) -> list[str]:
        keys = []
        for a in group:
            if stale:
                keys.append(f"agent_{a}/ratio_max")
            if self.objective.tis_cap is not None:
                keys.append(f"agent_{a}/is_weight_max")
        return keys

    # -- the plan -------------------------------------------------------------------------------
    def plan(
        self,
        group: Sequence[int],
        rows: Sequence[PolicyRow],
        window: Sequence[Sequence[int]],
        optimizers: Mapping[str, torch.optim.Optimizer],
        *,
        chunk_size: int | None,
        old: Mapping[int, OldScores] | None = None,
        heads: Sequence[ValueModel | None] | None = None,
    ) -> StepPlan[list[Entry]]:
        """One step of ``group`` over the rows ``window[k]`` (indices into ``rows``) of its
        ``k``-th agent; ``old`` holds the rows' log-probs before the round when they are stale;
        ``heads`` a value head per agent of the group (None: no head)."""
        flat = [(k, i) for k, indices in enumerate(window) for i in indices]
        size = chunk_size or max(len(flat), 1)
        chunks = [flat[s : s + size] for s in range(0, len(flat), size)]
        stale = old is not None
        has_heads = heads is not None and any(h is not None for h in heads)
        return StepPlan(
            optimizers=optimizers,
            chunks=chunks,
            count=lambda chunk: self._count(group, rows, chunk),
            loss=lambda chunk, totals: self._loss(group, rows, chunk, totals, old, heads),
            count_keys=self.count_keys(group),
            sum_keys=self.sum_keys(group, stale, has_heads),
            max_keys=self.max_keys(group, stale),
        )

    def _count(
        self, group: Sequence[int], rows: Sequence[PolicyRow], chunk: list[Entry]
    ) -> dict[str, float]:
        counts: dict[str, float] = {}
        for k, i in chunk:
            a, row = group[k], rows[i]
            for key, n in (
                (f"agent_{a}/samples", 1),
                (f"agent_{a}/tokens", len(row.completion_ids)),
                (f"agent_{a}/turn_{row.turn}/samples", 1),
            ):
                counts[key] = counts.get(key, 0.0) + n
        return counts

    def score(
        self,
        group: Sequence[int],
        rows: Sequence[PolicyRow],
        chunk: list[Entry],
        heads: HeadCaptures | None = None,
    ) -> JointPass:
        """One pass of the chunk's rows under their agents (and the group's reference)."""
        refs, obj = self.references, self.objective
        temps = [obj.temperatures[group[k]] for k, _ in chunk]
        temperature: Temperature = temps[0] if len(set(temps)) == 1 else torch.tensor(temps)
        truncation = None
        if obj.tis_cap is not None:
            settings = [obj.truncations[group[k]] for k, _ in chunk]
            truncation = Truncation.of(settings, self.agents[group[0]].device)
        return joint_pass(
            [self.agents[a] for a in group],
            [k for k, _ in chunk],
            [rows[i].prompt_ids for _, i in chunk],
            [rows[i].completion_ids for _, i in chunk],
            None if refs is None else refs[group[0]],
            policy_context=heads,
            # A value head reads the trunk's states of the prompt's last token, which the
            # shared-prefix pass does not give in one forward.
            prefix_sharing=obj.prefix_sharing and heads is None,
            temperature=temperature,
            entropy=obj.entropy,
            truncation=truncation,
        )

    def old_logprobs(
        self,
        group: Sequence[int],
        rows: Sequence[PolicyRow],
        indices: Sequence[Sequence[int]],
        chunk_size: int | None,
    ) -> dict[int, OldScores]:
        """Each row's completion log-probs under the current policy, without gradient: taken
        before a round's first step, they are the rows' "old" policy for the later steps (and,
        with a separate sampler, the truncated distribution its weights compare with)."""
        flat = [(k, i) for k, rows_k in enumerate(indices) for i in rows_k]
        size = chunk_size or max(len(flat), 1)
        out: dict[int, OldScores] = {}
        for a in group:
            self.agents[a].model.train()
        with torch.no_grad():
            for s in range(0, len(flat), size):
                chunk = flat[s : s + size]
                scored = self.score(group, rows, chunk)
                mask = scored.batch.completion_mask.bool()
                truncated = scored.truncated_logprobs
                for b, ((_, i), m) in enumerate(zip(chunk, mask, strict=True)):
                    out[i] = OldScores(
                        logprobs=scored.logprobs[b][m],
                        truncated_logprobs=None if truncated is None else truncated[b][m],
                    )
        return out

    def _loss(
        self,
        group: Sequence[int],
        rows: Sequence[PolicyRow],
        chunk: list[Entry],
        totals: Mapping[str, float],
        old: Mapping[int, OldScores] | None,
        heads: Sequence[ValueModel | None] | None,
    ) -> ChunkLoss:
        for a in group:
            self.agents[a].model.train()
        captures = None if heads is None else HeadCaptures(heads)
        scored = self.score(group, rows, chunk, captures)
        total = scored.logprobs.new_zeros(())
        sums: dict[str, Tensor] = {}
        maxima: dict[str, Tensor] = {}
        for k, a in enumerate(group):
            mine = scored.rows(k)
            if not mine:
                continue
            ctx = _AgentRows(scored, mine, [chunk[r][1] for r in mine], rows)
            loss = self._agent_loss(a, ctx, totals, old, sums, maxima)
            head = None if captures is None else captures.captured[k]
            if head is not None:
                # The head reads every row of the pass at its state (the prompt's last token).
                positions = torch.tensor([len(rows[i].prompt_ids) - 1 for _, i in chunk])
                values = head.values(positions)[ctx.selector]
                loss = loss + self._head_loss(a, ctx, values, totals, sums)
            total = total + loss
        return ChunkLoss(total, sums, maxima)

    def _agent_loss(
        self,
        a: int,
        ctx: _AgentRows,
        totals: Mapping[str, float],
        old: Mapping[int, OldScores] | None,
        sums: dict[str, Tensor],
        maxima: dict[str, Tensor],
    ) -> Tensor:
        obj = self.objective
        lp, mask = ctx.logprobs, ctx.mask
        device = lp.device
        adv = torch.tensor([r.advantage for r in ctx.picked], device=device, dtype=lp.dtype)
        old_lp = None if old is None else _placed([old[i].logprobs for i in ctx.indices], mask)
        weights = None
        if obj.tis_cap is not None:
            sampler = [torch.tensor(r.sampler_logprobs or (), device=device) for r in ctx.picked]
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
        ref = ctx.reference
        per_token = policy_token_losses(
            lp,
            mask,
            adv,
            old_logprobs=old_lp,
            clip_range=obj.clip_range if old_lp is not None else None,
            is_weights=weights,
            ref_logprobs=ref,
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
        if ref is not None:
            kl = kl_k3_tokens(lp.detach(), ref, mask, check=False).sum(dim=1)
            for turn in {r.turn for r in ctx.picked}:
                idx = [j for j, r in enumerate(ctx.picked) if r.turn == turn]
                sums[f"agent_{a}/turn_{turn}/kl_sum"] = kl[torch.tensor(idx, device=device)].sum()
        if ctx.entropy is not None:
            sums[f"agent_{a}/entropy_sum"] = torch.where(mask, ctx.entropy, 0.0).sum()
        if old_lp is not None and obj.clip_range is not None:
            stats = ratio_stats(lp, old_lp, mask, obj.clip_range)
            for key in ("ratio_sum", "clipped", "approx_kl_sum"):
                sums[f"agent_{a}/{key}"] = stats[key]
            maxima[f"agent_{a}/ratio_max"] = stats["ratio_max"]
        return loss

    def _head_loss(
        self,
        a: int,
        ctx: _AgentRows,
        values: Tensor,
        totals: Mapping[str, float],
        sums: dict[str, Tensor],
    ) -> Tensor:
        """The head's value loss of the agent's rows (``values``), a mean over the step's
        samples, times ``value_loss_coef``."""
        obj, picked = self.objective, ctx.picked
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


class _AgentRows:
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


def _placed(values: Sequence[Tensor], mask: Tensor) -> Tensor:
    """Per row its completion tokens' values (1-D each) put at the row's mask positions."""
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    out[mask] = torch.cat([v.to(mask.device, torch.float32) for v in values])
    return out
