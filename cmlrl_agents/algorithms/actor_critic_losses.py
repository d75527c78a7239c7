"""The actor-critic losses of one scored chunk: pure functions of tensors and samples.

The learner scores a chunk's rows (one agent, or adapter agents of one base in one
mixed-adapter pass, ``adapters.joint_pass``) and hands each agent's rows here: its policy loss
(REINFORCE or PPO-clipped), its value head's loss when the head sits on the actor, and its k3 KL
to the reference.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from cmlrl_agents.algorithms.actor_critic_config import ActorCriticConfig
from cmlrl_agents.algorithms.actor_critic_rollouts import RolloutSample
from cmlrl_agents.functional.losses import kl_k3, policy_gradient_loss, value_loss

__all__ = ["actor_losses", "host_stats", "sample_value_loss"]


def actor_losses(
    rows: Sequence[RolloutSample],
    logprobs: torch.Tensor,
    mask: torch.Tensor,
    args: ActorCriticConfig,
    *,
    old: Sequence[torch.Tensor] | None = None,
    values: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """``policy_loss`` of ``rows`` (their ``[B, L]`` ``logprobs`` and completion ``mask``), plus
    ``value_loss`` given the head's ``values`` and ``reference_kl`` (per row) given the
    reference's log-probs; ``old`` holds each row's completion log-probs before the update."""
    device = logprobs.device
    old_lp = None
    if old is not None:
        old_lp = torch.zeros_like(logprobs)
        old_lp[mask.bool()] = torch.cat(list(old)).to(device)
    adv = torch.tensor(
        [
            s.normalized_advantage if s.normalized_advantage is not None else s.advantage
            for s in rows
        ],
        device=device,
    )
    out = {
        "policy_loss": policy_gradient_loss(
            logprobs, mask, adv, "sequence_sum", old_lp, args.ppo_clip_range
        )
    }
    if values is not None:
        out["value_loss"] = sample_value_loss(values, rows, args.value_clip_range)
    if ref_logprobs is not None:
        out["reference_kl"] = kl_k3(logprobs, ref_logprobs, mask)
    return out


def sample_value_loss(
    values: torch.Tensor, rows: Sequence[RolloutSample], clip_range: float | None
) -> torch.Tensor:
    """The value loss of ``values`` (one per row) to the rows' GAE returns, clipped around the
    values at collection when ``clip_range`` is given."""
    targets = torch.tensor([s.returns for s in rows], device=values.device)
    old = (
        None if clip_range is None else torch.tensor([s.value for s in rows], device=values.device)
    )
    return value_loss(values, targets, old, clip_range)


def host_stats(
    sums: dict[str, torch.Tensor], kls: list[tuple[list[int], torch.Tensor]]
) -> tuple[dict[str, float], dict[int, list[float]]]:
    """A step's loss sums and per-sample KLs (with their turns), gathered on the device, as
    floats from ONE device-to-host copy."""
    keys = list(sums)
    pieces = [torch.stack([sums[key] for key in keys])] if keys else []
    pieces += [kl for _, kl in kls]
    if not pieces:
        return {}, {}
    flat = torch.cat([p.reshape(-1).float() for p in pieces]).tolist()
    by_turn: dict[int, list[float]] = defaultdict(list)
    turns = [t for ts, _ in kls for t in ts]
    for turn, value in zip(turns, flat[len(keys) :], strict=True):
        by_turn[turn].append(value)
    return dict(zip(keys, flat[: len(keys)], strict=True)), by_turn
