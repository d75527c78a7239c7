"""Returns: rollout trees (MAGRPO family), joint-action credit, chains and GAE (actor-critic).

Pure tensor functions: no model, no tokenizer, no state. Inputs are checked and a bad one raises
``ValueError`` naming the argument, what it got and the fix, because a wrongly shaped return
broadcasts silently and trains on nonsense.
"""

from __future__ import annotations

import torch
from torch import Tensor

from cmlrl_agents._checks import check_finite, check_float

__all__ = [
    "cross_credit",
    "discounted_returns",
    "ended_chain_returns",
    "gae",
    "held_rewards",
    "tree_returns",
]


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def _check_prefix_mask(mask: object, shape: torch.Size) -> Tensor:
    """Return ``mask`` as bool after checking it is ``[B, T]`` of 0/1 with every row 1...1 0...0."""
    if not isinstance(mask, Tensor):
        raise ValueError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.shape != shape:
        raise ValueError(
            f"mask must have the shape of rewards {tuple(shape)}, got {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        if not bool(((mask == 0) | (mask == 1)).all()):
            raise ValueError("mask must hold only 0 and 1 (1 for steps that happened)")
        mask = mask != 0
    # A gap (0 then 1) would make "the episode ends at the last valid step" ambiguous.
    if bool((mask[:, 1:] & ~mask[:, :-1]).any()):
        row = int((mask[:, 1:] & ~mask[:, :-1]).any(dim=1).nonzero()[0])
        raise ValueError(
            f"mask row {row} is not a prefix (a 1 follows a 0: {mask[row].int().tolist()}); "
            "each episode must be its steps 0..L-1 followed by padding"
        )
    return mask


def tree_returns(
    rewards: list[Tensor],
    parents: list[Tensor],
    discount: float,
    turns_left: list[Tensor] | None = None,
) -> list[Tensor]:
    """Returns of every joint action in a rollout tree, level by level.

    Level ``t`` holds the ``n_t`` joint actions taken at turn ``t + 1``. A joint action's return is
    its reward plus the discounted MEAN return of its children (the joint actions sampled from
    the state it led to): ``R_t[j] = r_t[j] + discount * mean(R_{t+1}[children of j])``.

    A joint action that ended its branch EARLY (its reward passed the early-termination
    threshold) has ``m = turns_left[t][j] > 0`` unplayed turns. Its sibling that missed the target
    collects rewards for those turns, so giving the ended one its reward alone would credit
    success below failure. The ended branch is an absorbing success state instead: it keeps its
    reward for each unplayed turn, ``R_t[j] = r_t[j] * (1 + discount + ... + discount**m)``, so
    siblings are compared on the same horizon. A childless joint action with ``m = 0`` (the last
    turn) keeps its reward.

    Args:
        rewards: ``T`` 1-D float tensors; ``rewards[t]`` has shape ``[n_t]``.
        parents: ``T`` tensors; for ``t >= 1`` ``parents[t]`` has shape ``[n_t]``, dtype long,
            and ``parents[t][k]`` is the index in level ``t - 1`` of the joint action that led to
            ``k``. ``parents[0]`` is ignored (pass an empty tensor).
        discount: in ``[0, 1]``. Honoured (the reference ignored it: bug B8).
        turns_left: ``None`` (no branch ended early) or ``T`` long tensors shaped like
            ``rewards``: the turns each joint action's branch did not play because it ended
            early (0 for joint actions that have children or were on the last turn).

    Returns:
        ``T`` tensors; entry ``t`` has shape ``[n_t]``. One level gives the rewards (flat case).
    """
    _check_tree(rewards, parents, discount)
    held = held_rewards(rewards, turns_left, discount)
    out: list[Tensor] = [rewards[-1] + held[-1]]
    for t in range(len(rewards) - 2, -1, -1):
        child_returns, idx = out[0], parents[t + 1]
        sums = torch.zeros_like(rewards[t]).index_add_(0, idx, child_returns)
        counts = torch.zeros_like(rewards[t]).index_add_(0, idx, torch.ones_like(child_returns))
        if bool(((counts > 0) & (held[t] != 0)).any()):
            raise ValueError(
                f"turns_left[{t}] is > 0 for a joint action that has children; only a branch "
                "that ended early has unplayed turns"
            )
        # Childless nodes have sums == 0, so clamping the count keeps them at their own reward.
        out.insert(0, rewards[t] + held[t] + discount * sums / counts.clamp(min=1))
    return out


def _check_tree(rewards: list[Tensor], parents: list[Tensor], discount: float) -> None:
    _check_unit("discount", discount)
    if len(rewards) == 0:
        raise ValueError(
            "rewards is empty; pass at least one level (rewards[0] for the first turn)"
        )
    if len(parents) != len(rewards):
        raise ValueError(
            f"parents must have one entry per level like rewards ({len(rewards)}), "
            f"got {len(parents)}; use an empty tensor for parents[0]"
        )
    for t, r in enumerate(rewards):
        check_float(f"rewards[{t}]", r, dim=1)
        check_finite(f"rewards[{t}]", r)
    for t in range(1, len(rewards)):
        p, n_prev = parents[t], rewards[t - 1].shape[0]
        if not isinstance(p, Tensor) or p.dtype != torch.long or p.shape != rewards[t].shape:
            got = f"{p.dtype} {tuple(p.shape)}" if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(
                f"parents[{t}] must be a long tensor of shape {tuple(rewards[t].shape)}, got {got}"
            )
        if p.numel() and (int(p.min()) < 0 or int(p.max()) >= n_prev):
            raise ValueError(
                f"parents[{t}] must index level {t - 1} (0..{n_prev - 1}), got values "
                f"{int(p.min())}..{int(p.max())}"
            )


def ended_chain_returns(
    rewards: list[float], num_turns: int, threshold: float | None, discount: float
) -> list[float]:
    """Returns of one fully played chain of turns as training's early termination scores it.

    Training ends a branch at the first turn ``t < num_turns`` whose reward exceeds
    ``threshold``; that turn then holds its reward for the unplayed turns (:func:`tree_returns`).
    Returns one value per turn the branch would have played (``len <= len(rewards)``).
    """
    played = len(rewards)
    if threshold is not None:
        for t, r in enumerate(rewards[: num_turns - 1]):
            if r > threshold:
                played = t + 1
                break
    kept = [torch.tensor([float(r)]) for r in rewards[:played]]
    parents = [torch.zeros(1, dtype=torch.long) for _ in kept]
    left = [torch.zeros(1, dtype=torch.long) for _ in kept]
    left[-1][0] = num_turns - played if played < len(rewards) else 0
    return [float(r) for r in tree_returns(kept, parents, discount, left)]


def held_rewards(
    rewards: list[Tensor], turns_left: list[Tensor] | None, discount: float
) -> list[Tensor]:
    """Per level, what an early-ended branch earns by keeping its reward for its unplayed turns:
    ``r * (discount + discount**2 + ... + discount**m)``; 0 where ``m == 0``."""
    if turns_left is None:
        return [torch.zeros_like(r) for r in rewards]
    if len(turns_left) != len(rewards):
        raise ValueError(
            f"turns_left must have one entry per level like rewards ({len(rewards)}), got "
            f"{len(turns_left)}"
        )
    held = []
    for t, (r, m) in enumerate(zip(rewards, turns_left, strict=True)):
        if not isinstance(m, Tensor) or m.dtype != torch.long or m.shape != r.shape:
            got = f"{m.dtype} {tuple(m.shape)}" if isinstance(m, Tensor) else type(m).__name__
            raise ValueError(
                f"turns_left[{t}] must be a long tensor of shape {tuple(r.shape)}, got {got}"
            )
        if m.numel() and int(m.min()) < 0:
            raise ValueError(f"turns_left[{t}] must be >= 0, got {m.tolist()}")
        top = int(m.max()) if m.numel() else 0
        # factor[k] = discount + ... + discount**k (factor[0] = 0), looked up per joint action.
        powers = torch.full((top,), float(discount), dtype=r.dtype) ** torch.arange(1, top + 1)
        factor = torch.cat([torch.zeros(1, dtype=r.dtype), powers.cumsum(0)])
        held.append(r * factor[m])
    return held


def cross_credit(joint_returns: Tensor, num_agents: int, group_size: int) -> Tensor:
    """Per-agent credit from the returns of all ``G**N`` crossed joint actions.

    Joint action ``k`` is the ``k``-th tuple of ``itertools.product(range(G), repeat=N)`` (agent 0
    varies slowest). The credit of agent ``a``'s completion ``i`` is the MEAN return of the
    ``G**(N-1)`` joint actions it took part in. The mean (not the reference's sum) keeps the
    credit on the scale of one return; the output is always ``G`` values per agent (bug B6).

    Args:
        joint_returns: ``[..., G**N]`` float.
        num_agents: ``N >= 1``.
        group_size: ``G >= 1`` completions per agent.

    Returns:
        ``[..., N, G]``; with ``N == 1`` it equals ``joint_returns.unsqueeze(-2)``.
    """
    check_float("joint_returns", joint_returns)
    if isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1:
        raise ValueError(f"num_agents must be an int >= 1, got {num_agents!r}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    expected = group_size**num_agents
    if joint_returns.dim() == 0 or joint_returns.shape[-1] != expected:
        raise ValueError(
            f"joint_returns must have last dim G**N = {group_size}**{num_agents} = {expected}, "
            f"got shape {tuple(joint_returns.shape)}"
        )
    lead = joint_returns.shape[:-1]
    # Row-major reshape puts agent a on axis len(lead) + a, matching itertools.product order.
    grid = joint_returns.reshape(*lead, *([group_size] * num_agents))
    credits = []
    for a in range(num_agents):
        others = [len(lead) + b for b in range(num_agents) if b != a]
        # mean(dim=[]) would reduce EVERY axis, so the single-agent case must skip it.
        credits.append(grid.mean(dim=others) if others else grid)
    return torch.stack(credits, dim=-2)


def discounted_returns(rewards: Tensor, mask: Tensor, discount: float) -> Tensor:
    """Reward-to-go ``G_t = r_t + discount * G_{t+1}`` for chains that may end early.

    Args:
        rewards: ``[B, T]`` float; entries where ``mask`` is 0 are ignored (may be anything).
        mask: ``[B, T]`` bool or 0/1; 1 for steps that happened, each row a prefix of ones.
        discount: in ``[0, 1]``.

    Returns:
        ``[B, T]``; 0 where ``mask`` is 0.
    """
    check_float("rewards", rewards, dim=2)
    valid = _check_prefix_mask(mask, rewards.shape)
    check_finite("rewards", rewards, valid)
    _check_unit("discount", discount)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    # A loop over turns (T is a handful), vectorised over the batch; padding rewards are 0 so
    # the running sum is still 0 when it reaches an episode's last step.
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + discount * running
        out[:, t] = running
    return out


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, discount: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (Schulman et al. 2016, arXiv:1506.02438) over turns.

    ``delta_t = r_t + discount * V_{t+1} - V_t`` with ``V = 0`` after an episode's last valid
    step (the end is terminal: no bootstrap), ``A_t = delta_t + discount * lam * A_{t+1}``.
    ``lam = 0`` gives TD(0): ``A_t + V_t = r_t + discount * V_{t+1}``; ``lam = 1`` gives the
    Monte-Carlo return minus ``V_t``.

    Args:
        rewards: ``[B, T]`` float.
        values: ``[B, T]`` float, the critic's ``V(s_t)`` at rollout time.
        mask: ``[B, T]`` bool or 0/1; 1 for steps that happened, each row a prefix of ones.
        discount: in ``[0, 1]``.
        lam: in ``[0, 1]``.

    Returns:
        ``(advantages, returns)``, both ``[B, T]``, ``returns = advantages + values``; both 0
        where ``mask`` is 0. Detached: they are targets, and gradient flowing through them
        into the critic would corrupt both losses.
    """
    check_float("rewards", rewards, dim=2)
    check_float("values", values, dim=2)
    if values.shape != rewards.shape:
        raise ValueError(
            f"values must have the shape of rewards {tuple(rewards.shape)}, "
            f"got {tuple(values.shape)}"
        )
    valid = _check_prefix_mask(mask, rewards.shape)
    check_finite("rewards", rewards, valid)
    check_finite("values", values, valid)
    _check_unit("discount", discount)
    _check_unit("lam", lam)

    zeros = torch.zeros_like(rewards)
    r = torch.where(valid, rewards.detach(), zeros)
    v = torch.where(valid, values.detach(), zeros)
    # Shift left: the next step's value and validity; past the end both are 0 (terminal).
    next_v = torch.cat([v[:, 1:], zeros[:, :1]], dim=1)
    next_m = torch.cat([valid[:, 1:], torch.zeros_like(valid[:, :1])], dim=1).to(r.dtype)
    delta = r + discount * next_v - v
    adv = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = delta[:, t] + discount * lam * next_m[:, t] * running
        adv[:, t] = running
    adv = torch.where(valid, adv, zeros)
    return adv, torch.where(valid, adv + v, zeros)
