"""The policy part of an optimizer step, shared by the MAGRPO family and the actor-critics.

A step's policy rows are scored by group: the adapter agents of one base together in one
mixed-adapter pass (``adapters.joint_pass``), any other agent as a group of one, at each
agent's sampling temperature (the tempered distribution the sampler drew from, before
top-k/top-p truncation, as TRL does). :class:`PolicyStep` plans those passes as the engine's
chunks, declares the keys every rank sums, and takes a round's "old" log-probs before its first
step (the round's steps: :mod:`cmlrl_agents.learning.policy_round`); what each agent's scored
rows cost is :mod:`cmlrl_agents.learning.policy_loss`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor

from cmlrl_agents.learning.batch import PolicyRow
from cmlrl_agents.learning.engine import ChunkLoss, StepPlan
from cmlrl_agents.learning.policy_loss import (
    AgentRows,
    OldScores,
    PolicyObjective,
    agent_loss,
    head_loss,
)
from cmlrl_agents.policies.adapters import JointPass, joint_pass
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.logprobs import Temperature
from cmlrl_agents.policies.reference import Reference
from cmlrl_agents.policies.sampling import Truncation
from cmlrl_agents.policies.value_head import HeadCaptures, ValueModel

__all__ = ["PolicyStep"]

Entry = tuple[int, int]
"""``(k, i)``: row ``i`` of the batch, of the group's ``k``-th agent."""


class PolicyStep:
    """Plans the policy part of a step for one group of agents over a round's rows."""

    def __init__(
        self,
        agents: Sequence[LLMAgent],
        references: Sequence[Reference] | None,
        objective: PolicyObjective,
        num_turns: int,
        *,
        precision: Callable[[torch.device], AbstractContextManager[object]] | None = None,
    ) -> None:
        self.agents = list(agents)
        self.references = references
        self.objective = objective
        self.num_turns = num_turns
        self.precision = precision
        """The loss passes' precision on a device (the engine's ``autocast``): the old
        log-probs are scored under it too, so they are the loss's function (None: float32)."""

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
        old: MutableMapping[int, OldScores] | None = None,
        record_old: bool = False,
        heads: Sequence[ValueModel | None] | None = None,
    ) -> StepPlan[list[Entry]]:
        """One step of ``group`` over the rows ``window[k]`` (indices into ``rows``) of its
        ``k``-th agent; ``old`` holds the rows' log-probs before the round when they are stale
        (``record_old``: this is the round's first step, whose own pass gives its rows' old
        log-probs); ``heads`` a value head per agent of the group (None: no head)."""
        flat = [(k, i) for k, indices in enumerate(window) for i in indices]
        size = chunk_size or max(len(flat), 1)
        chunks = [flat[s : s + size] for s in range(0, len(flat), size)]
        stale = old is not None
        has_heads = heads is not None and any(h is not None for h in heads)
        return StepPlan(
            optimizers=optimizers,
            chunks=chunks,
            count=lambda chunk: self._count(group, rows, chunk),
            loss=lambda chunk, totals: self._loss(
                group, rows, chunk, totals, old, record_old, heads
            ),
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
        first_step: Collection[int] = (),
    ) -> dict[int, OldScores]:
        """Each row's completion log-probs under the current policy, without gradient: taken
        before a round's first step, they are the rows' "old" policy for the later steps (and,
        with a separate sampler, the truncated distribution its weights compare with).

        Rows of the item slots ``first_step`` are left out: the first step scores them on the
        same weights and records theirs (``plan(record_old=True)``), so a round of one window
        and several epochs needs no pass of its own."""
        flat = [
            (k, i)
            for k, rows_k in enumerate(indices)
            for i in rows_k
            if rows[i].item_slot not in first_step
        ]
        size = chunk_size or max(len(flat), 1)
        out: dict[int, OldScores] = {}
        for a in group:
            self.agents[a].model.train()
        device = self.agents[group[0]].device
        precision = nullcontext() if self.precision is None else self.precision(device)
        with torch.no_grad(), precision:
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
        old: MutableMapping[int, OldScores] | None,
        record_old: bool,
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
            ctx = AgentRows(scored, mine, [chunk[r][1] for r in mine], rows)
            loss = agent_loss(
                self.objective, a, ctx, totals, old, sums, maxima, record_old=record_old
            )
            head = None if captures is None else captures.captured[k]
            if head is not None:
                # The head reads every row of the pass at its state (the prompt's last token).
                positions = torch.tensor([len(rows[i].prompt_ids) - 1 for _, i in chunk])
                values = head.values(positions)[ctx.selector]
                loss = loss + head_loss(self.objective, a, ctx, values, totals, sums)
            total = total + loss
        return ChunkLoss(total, sums, maxima)
