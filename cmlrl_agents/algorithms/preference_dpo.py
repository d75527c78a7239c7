"""``DPOLearner``: the multi-agent DPO step against frozen reference models.

A joint response's log-probability is the sum of the agents' sequence log-probs (the team's
policy is the product of its agents'), so the DPO margin of a pair is ``beta`` times the sum over
agents of ``(log pi_a - log pi_ref_a)(chosen_a) - (...)(rejected_a)``. One backward through that
joint loss gives every agent its gradient; each agent's optimizer then steps. The reference
log-probs of a round's pairs are computed once (:meth:`DPOLearner.prepare`), since the
reference never changes.

Adapter agents (``peft_config``): each optimizer holds its adapter alone and the reference is
the shared base with its adapters disabled (``reference.BaseWithoutAdapters``, no copy). The
agents of one base without active dropout score in ONE mixed-adapter pass (peft's per-row
``adapter_names``: ``adapters.joint_pass``, as the policy-gradient steps do); the others agent
by agent with their adapter active. peft's ``set_adapter`` (and leaving ``disable_adapter()``)
freezes every adapter but the active one, and autograd drops the gradient of a parameter that no
longer requires it at backward time, so every adapter agent's parameters are set trainable again
before its pass and before the backward of the joint loss.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from cmlrl_agents.algorithms.preference_config import MADPOConfig
from cmlrl_agents.algorithms.preference_pairs import PreferencePair
from cmlrl_agents.foundation.distributed import data_parallel
from cmlrl_agents.functional.preference_losses import dpo_loss, joint_log_ratio
from cmlrl_agents.learning.engine import ChunkLoss, StepEngine, StepPlan, mean_metrics
from cmlrl_agents.learning.learner import OptimizedLearner
from cmlrl_agents.learning.optim import agent_optimizers, refuse_shared_parameters
from cmlrl_agents.policies.adapters import checkpoint_models, joint_pass, step_groups
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.policies.reference import Reference, reference_logprobs, reference_policies
from cmlrl_agents.policies.tokens import build_batch

__all__ = ["DPOLearner", "PairEpoch", "PreparedPairs", "pair_tokens"]

Rows = list[list[int]]

DPO_STATS = ("accuracy", "margin", "chosen_reward", "rejected_reward")
"""A DPO step's metrics (means over its pairs of the implicit rewards ``beta * log-ratio``)."""


def pair_tokens(pair: PreferencePair, agents: Sequence[LLMAgent]) -> tuple[Rows, Rows, Rows]:
    """Per agent ``(prompt_ids, chosen_ids, rejected_ids)``: the sampled tokens when the pair
    has them, else the texts tokenized (prompt as the agent formats it, response + EOS)."""
    if pair.prompt_ids is not None and pair.chosen_ids is not None and pair.rejected_ids:
        return (
            [list(r) for r in pair.prompt_ids],
            [list(r) for r in pair.chosen_ids],
            [list(r) for r in pair.rejected_ids],
        )
    prompts: Rows = []
    chosen: Rows = []
    rejected: Rows = []
    for a, agent in enumerate(agents):
        prompts.append(agent.encode_prompts([pair.prompts[a]])[0])
        eos = agent.tokenizer.eos_token_id
        end = [] if eos is None else [int(eos)]
        for text, out in ((pair.chosen[a], chosen), (pair.rejected[a], rejected)):
            out.append(list(agent.tokenizer(text, add_special_tokens=False)["input_ids"]) + end)
    return prompts, chosen, rejected


@dataclass
class PreparedPairs:
    """A round's pairs as tokens, with their reference log-probs ``[N, P]``."""

    pairs: list[PreferencePair]
    prompts: list[Rows]
    """``prompts[a][p]``: agent a's prompt tokens of pair p (likewise chosen, rejected)."""
    chosen: list[Rows]
    rejected: list[Rows]
    ref_chosen: Tensor
    ref_rejected: Tensor


@dataclass(frozen=True)
class PairEpoch:
    """One pass over a round's prepared pairs: ``pairs`` in ``order`` (the trainer draws it
    from the run's keys), ``pair_batch_size`` pairs per optimizer step."""

    pairs: PreparedPairs
    order: Sequence[int]


class DPOLearner(OptimizedLearner[MADPOConfig]):
    """Per agent: an AdamW optimizer (of its adapter, for an adapter agent) and its frozen
    reference: a copy of its initial weights, or its base with adapters disabled."""

    def __init__(self, agents: Sequence[LLMAgent], args: MADPOConfig) -> None:
        self.agents = list(agents)
        self.args = args
        self.parallel = data_parallel()
        self.parallel.broadcast_parameters(a.model for a in self.agents)
        self.engine = StepEngine(self.parallel, bf16=args.bf16)
        self.optimizers = agent_optimizers(self.agents, args)
        refuse_shared_parameters(self.named_optimizers())
        devices = resolve_devices(args.reference_devices, len(self.agents), "reference_devices")
        self.reference_models: list[Reference] = reference_policies(self.agents, devices)
        self.schedulers: dict[str, torch.optim.lr_scheduler.LambdaLR] = {}

    def named_optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {f"agent_{i}": opt for i, opt in enumerate(self.optimizers)}

    def _unfreeze(self, agents: Sequence[int]) -> None:
        for a in agents:
            if self.agents[a].adapter is not None:
                for p in self.agents[a].trainable_parameters():
                    p.requires_grad_(True)

    def policy_logprobs(self, data: PreparedPairs, chunk: Sequence[int]) -> tuple[Tensor, Tensor]:
        """``[A, n]`` sequence log-probs of the chunk's chosen and rejected responses under the
        current policy, with gradients, on the CPU (the joint sum needs every agent's values on
        one device): mixed-adapter passes for the adapters of a shared base, else one pass per
        agent of its chosen and rejected rows."""
        n = len(chunk)
        out: list[Tensor] = [torch.empty(0)] * len(self.agents)
        for group in step_groups(self.agents):
            prompts, rows = [], []
            for a in group:
                mine = [data.prompts[a][i] for i in chunk]
                prompts += mine + mine
                rows += [data.chosen[a][i] for i in chunk] + [data.rejected[a][i] for i in chunk]
            owners = [k for k in range(len(group)) for _ in range(2 * n)]
            agents = [self.agents[a] for a in group]
            both = joint_pass(agents, owners, prompts, rows).logprobs.sum(dim=1).cpu()
            for k, a in enumerate(group):
                out[a] = both[2 * n * k : 2 * n * (k + 1)]
        # Activating one adapter froze the others of its base; their graphs are recorded, and
        # the backward must find them trainable to give them their gradients.
        self._unfreeze(range(len(self.agents)))
        scores = torch.stack(out)
        return scores[:, :n], scores[:, n:]

    def prepare(self, pairs: list[PreferencePair]) -> PreparedPairs:
        """Tokenize the pairs and score them once under the reference models."""
        tokens = [pair_tokens(p, self.agents) for p in pairs]
        prompts = [[t[0][a] for t in tokens] for a in range(len(self.agents))]
        chosen = [[t[1][a] for t in tokens] for a in range(len(self.agents))]
        rejected = [[t[2][a] for t in tokens] for a in range(len(self.agents))]
        size = self.args.forward_batch_size or len(pairs)
        ref_c, ref_r = [], []
        for a, agent in enumerate(self.agents):
            ref = self.reference_models[a]
            parts_c: list[Tensor] = []
            parts_r: list[Tensor] = []
            for s in range(0, len(pairs), size):
                for rows, out in ((chosen[a], parts_c), (rejected[a], parts_r)):
                    batch = build_batch(
                        prompts[a][s : s + size], rows[s : s + size], agent.pad_token_id
                    ).to(agent.device)
                    with self.engine.autocast(agent.device):  # the loss's precision
                        scores = reference_logprobs(ref, batch)
                    out.append(scores.sum(dim=1).cpu())
            ref_c.append(torch.cat(parts_c))
            ref_r.append(torch.cat(parts_r))
        return PreparedPairs(
            pairs, prompts, chosen, rejected, torch.stack(ref_c), torch.stack(ref_r)
        )

    def update(self, epoch: PairEpoch) -> dict[str, float]:
        """The optimizer steps of one pass, ``pair_batch_size`` pairs each; their mean metrics
        (``loss``, ``dpo/accuracy``, ``dpo/margin``, ``dpo/chosen_reward``,
        ``dpo/rejected_reward``, ``agent_i/grad_norm``)."""
        size = self.args.pair_batch_size
        steps: dict[str, list[float]] = defaultdict(list)
        for start in range(0, len(epoch.order), size):
            stats = self.step(epoch.pairs, epoch.order[start : start + size])
            for key, value in stats.items():
                name = key if key == "loss" or key.startswith("agent_") else f"dpo/{key}"
                steps[name].append(value)
        return mean_metrics(steps)

    def step(self, data: PreparedPairs, indices: Sequence[int]) -> dict[str, float]:
        """One optimizer step per agent on the pairs ``indices`` (forwards of
        ``forward_batch_size`` pairs); under torchrun every rank passes the step's same pairs
        and takes its contiguous block of them."""
        mine = self.parallel.shard(list(indices), max(len(indices), 1))
        size = self.args.forward_batch_size or max(len(mine), 1)
        plan = StepPlan(
            optimizers=self.named_optimizers(),
            chunks=[mine[s : s + size] for s in range(0, len(mine), size)],
            count=lambda chunk: {"pairs": float(len(chunk))},
            loss=lambda chunk, totals: self._loss(data, chunk, totals),
            count_keys=["pairs"],
            sum_keys=["loss", *(f"{k}_sum" for k in DPO_STATS)],
        )
        result = self.engine.step(
            plan, max_grad_norm=self.args.max_grad_norm, schedulers=self.schedulers
        )
        pairs = max(result.totals["pairs"], 1.0)
        stats = {"loss": result.stats["loss"]}
        stats.update({k: result.stats[f"{k}_sum"] / pairs for k in DPO_STATS})
        for i in range(len(self.agents)):
            stats[f"agent_{i}/grad_norm"] = result.stats[f"agent_{i}/grad_norm"]
        return stats

    def _loss(
        self, data: PreparedPairs, chunk: list[int], totals: Mapping[str, float]
    ) -> ChunkLoss:
        for agent in self.agents:
            agent.model.train()
        beta = self.args.dpo_beta
        pol_c, pol_r = self.policy_logprobs(data, chunk)
        chosen = joint_log_ratio(pol_c, data.ref_chosen[:, chunk])
        rejected = joint_log_ratio(pol_r, data.ref_rejected[:, chunk])
        loss = dpo_loss(chosen, rejected, beta).sum() / totals["pairs"]
        c, r = beta * chosen.detach(), beta * rejected.detach()
        sums = {
            "loss": loss.detach(),
            "accuracy_sum": (c > r).float().sum(),
            "margin_sum": (c - r).sum(),
            "chosen_reward_sum": c.sum(),
            "rejected_reward_sum": r.sum(),
        }
        return ChunkLoss(loss, sums)

    # -- saving ---------------------------------------------------------------------------------
    def checkpoint_parts(self) -> tuple[dict[str, torch.nn.Module], dict[str, object]]:
        models = checkpoint_models(self.agents)  # a shared base once, its adapters only
        return models, dict(self.named_optimizers())
