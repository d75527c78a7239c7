"""Credit: returns and advantages as pure functions of a rollout tree (no model, no state).

One meaning of early termination for every family: a branch whose reward passed the
threshold before the last turn is an absorbing state that keeps its reward for each turn it
did not play, ``r * (1 + discount + ... + discount**m)`` for ``m`` unplayed turns. Its siblings
that missed the target collect rewards for those turns, so giving the ended branch its reward
alone would credit success below failure. The MAGRPO family's tree returns, the actor-critics'
GAE and the evaluation's ``expected_return`` all use it (``functional/returns.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from cmlrl_agents.foundation.metrics import turn_key
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.functional.advantages import group_advantages, pooled_std
from cmlrl_agents.functional.returns import cross_credit, gae, held_rewards, tree_returns
from cmlrl_agents.learning.batch import PolicyRow
from cmlrl_agents.policies.agent import Completion

__all__ = [
    "SCALES",
    "advantage_scale",
    "agent_returns",
    "batch_stds",
    "agent_rows",
    "chain_credit",
    "group_rows",
    "joint_returns",
    "return_moments",
    "round_metrics",
    "round_stds",
    "sibling_advantages",
    "turns_left",
]


def turns_left(tree: RolloutTree) -> list[Tensor]:
    """Per level ``[branches * J]`` (flat): the turns each joint action's branch did not play
    because it ended early (0 where it went on, or on the last turn)."""
    return [
        torch.tensor(
            [
                tree.num_turns - level.turn if o.terminated else 0
                for row in level.outcomes
                for o in row
            ],
            dtype=torch.long,
        )
        for level in tree.levels
    ]


def joint_returns(tree: RolloutTree, discount: float) -> list[Tensor]:
    """Per level ``[branches, J]``: reward + discount x the mean return of the children; an
    early-ended branch absorbs (module docstring). Empty for an empty tree (a rank's empty
    share of a round)."""
    if not tree.levels:
        return []
    rewards = [level.rewards.reshape(-1) for level in tree.levels]
    parents = [torch.tensor([-1])]
    for level in tree.levels[1:]:
        parents.append(torch.tensor(level.parent).repeat_interleave(len(level.joints)))
    flat = tree_returns(rewards, parents, discount, turns_left(tree))
    return [
        r.reshape(len(level.states), len(level.joints))
        for r, level in zip(flat, tree.levels, strict=True)
    ]


def agent_returns(tree: RolloutTree, joint: list[Tensor]) -> list[Tensor]:
    """Per level ``[branches, N, G]``: the return credited to each agent's sample. aligned:
    sample g of every agent gets joint action g's return; cross: the mean over the joint
    actions the sample took part in."""
    out = []
    for level, returns in zip(tree.levels, joint, strict=True):
        if len(level.joints) == tree.num_generations:
            out.append(returns.unsqueeze(1).expand(-1, tree.num_agents, -1).contiguous())
        else:
            out.append(cross_credit(returns, tree.num_agents, tree.num_generations))
    return out


SCALES = ("group", "batch", "none")
"""What the MAGRPO family divides its advantages by (TRL's ``scale_rewards`` values): each
sibling group's own return std, one std over the whole round, or nothing."""


def advantage_scale(normalization: bool | str) -> str:
    """The scale of an ``advantage_normalization`` setting: True is "group" (the seed's and
    comlrl's meaning), False is "none"; the strings are TRL's ``scale_rewards``."""
    if normalization is True or normalization is False:
        return "group" if normalization else "none"
    if normalization not in SCALES:
        raise ValueError(
            f"advantage_normalization must be True, False or one of {list(SCALES)}, got "
            f"{normalization!r}."
        )
    return normalization


def return_moments(credit: list[Tensor], num_agents: int, num_turns: int) -> list[float]:
    """The count, sum and sum of squares (float64) of the returns credited to each agent's
    samples at each turn, flat in agent, turn, moment order (``3 * num_agents * num_turns``
    numbers; 0 for a turn this tree did not reach). Summed over ranks they give the whole
    round's std (:func:`batch_stds`), with one all-reduce whatever the shares' sizes."""
    moments = [0.0] * (3 * num_agents * num_turns)
    for t, returns in enumerate(credit):
        for a in range(num_agents):
            x = returns[:, a, :].double()
            k = 3 * (a * num_turns + t)
            moments[k : k + 3] = [float(x.numel()), float(x.sum()), float((x * x).sum())]
    return moments


def batch_stds(moments: list[float], num_agents: int, num_turns: int) -> list[list[float]]:
    """Per agent, per turn (turn 1 first): the population std of every return credited to the
    agent's samples at that turn (``moments`` from :func:`return_moments`, summed over ranks);
    0 for a turn no branch reached."""
    stds = []
    for a in range(num_agents):
        per_turn = []
        for t in range(num_turns):
            count, total, total_sq = moments[3 * (a * num_turns + t) : 3 * (a * num_turns + t + 1)]
            per_turn.append(pooled_std(count, total, total_sq) if count else 0.0)
        stds.append(per_turn)
    return stds


def round_stds(
    credit: list[Tensor],
    scale: str,
    num_agents: int,
    num_turns: int,
    sum_over_ranks: Callable[[list[float]], list[float]] | None = None,
) -> list[list[float]] | None:
    """Under ``scale="batch"`` the round's std per agent and turn (:func:`batch_stds` of
    ``credit``'s :func:`return_moments`, summed by ``sum_over_ranks`` when the round is split
    across ranks); None for the other scales, which need none."""
    if scale != "batch":
        return None
    moments = return_moments(credit, num_agents, num_turns)
    if sum_over_ranks is not None:
        moments = sum_over_ranks(moments)
    return batch_stds(moments, num_agents, num_turns)


def sibling_advantages(
    credit: list[Tensor],
    agent: int,
    advantage_mode: str,
    scale: str,
    round_stds: list[float] | None = None,
) -> list[Tensor]:
    """Per level, ``agent``'s advantage ``[branches, G]`` of each completion over its G
    siblings, from ``credit`` (:func:`agent_returns`): what the update trains on and the tree
    view shows. ``scale`` is one of :data:`SCALES`; "batch" divides each turn by ``round_stds``
    (the agent's, per turn, from :func:`batch_stds`)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {list(SCALES)}, got {scale!r}.")
    if (scale == "batch") != (round_stds is not None):
        raise ValueError(
            f"scale={scale!r} with round_stds={round_stds!r}: 'batch' divides by the round's "
            "std per turn (batch_stds(...)[agent]), and only 'batch' takes them."
        )
    return [
        group_advantages(
            returns[:, agent, :],
            advantage_mode,
            scale != "none",
            std=None if round_stds is None else round_stds[t],
        )
        for t, returns in enumerate(credit)
    ]


def agent_rows(
    tree: RolloutTree,
    agent: int,
    credit: list[Tensor],
    advantage_mode: str,
    scale: str,
    round_stds: list[float] | None = None,
) -> list[PolicyRow]:
    """Every completion of ``agent`` with its advantage over its G siblings (``credit`` from
    :func:`agent_returns`; ``scale`` and ``round_stds`` as :func:`sibling_advantages` takes
    them), in level, branch, sample order."""
    rows = []
    advantages = sibling_advantages(credit, agent, advantage_mode, scale, round_stds)
    for level, level_adv in zip(tree.levels, advantages, strict=True):
        adv = level_adv.tolist()
        for branch, samples in enumerate(level.completions[agent]):
            for g, completion in enumerate(samples):
                rows.append(
                    PolicyRow(
                        agent=agent,
                        item_slot=level.item_slot[branch],
                        turn=level.turn,
                        prompt_ids=completion.prompt_ids,
                        completion_ids=completion.completion_ids,
                        advantage=adv[branch][g],
                        finished=completion.finished,
                        sampler_logprobs=completion.sampler_logprobs,
                    )
                )
    return rows


def group_rows(
    tree: RolloutTree,
    credit: list[Tensor],
    advantage_mode: str,
    scale: str,
    round_stds: list[list[float]] | None = None,
) -> list[PolicyRow]:
    """:func:`agent_rows` of every agent, agent-major (``round_stds[agent]`` under "batch")."""
    return [
        row
        for agent in range(tree.num_agents)
        for row in agent_rows(
            tree,
            agent,
            credit,
            advantage_mode,
            scale,
            None if round_stds is None else round_stds[agent],
        )
    ]


def chain_credit(
    tree: RolloutTree, state_values: list[Tensor], discount: float, lam: float
) -> tuple[list[Tensor], list[Tensor]]:
    """GAE advantages and returns of every joint action, per level ``[branches, J]``, over each
    episode's chain of turns (the actor-critics' credit).

    ``state_values[t]`` is ``[branches]``: V of each state of level ``t``. Level 0's joint actions
    start the chains; a later level's branch continues its parent's chain (needs J = 1 there).
    A chain that ended early is terminal with its absorbing reward (module docstring).
    """
    if len(tree.levels) > 1 and any(len(level.joints) != 1 for level in tree.levels):
        raise ValueError("multi-turn chains need num_generations=1 (one joint action per state).")
    first = tree.levels[0]
    chains = [torch.arange(len(first.states) * len(first.joints)).reshape(len(first.states), -1)]
    for level in tree.levels[1:]:
        chains.append(chains[-1].reshape(-1)[torch.tensor(level.parent)].reshape(-1, 1))
    flat_rewards = [level.rewards.reshape(-1) for level in tree.levels]
    held = held_rewards(flat_rewards, turns_left(tree), discount)
    shape = (chains[0].numel(), len(tree.levels))
    rewards, values = torch.zeros(shape), torch.zeros(shape)
    mask = torch.zeros(shape, dtype=torch.bool)
    for t, (level, ids) in enumerate(zip(tree.levels, chains, strict=True)):
        flat = ids.reshape(-1)
        rewards[flat, t] = flat_rewards[t] + held[t]
        values[flat, t] = state_values[t].float().repeat_interleave(len(level.joints))
        mask[flat, t] = True
    adv, ret = gae(rewards, values, mask, discount, lam)
    return (
        [adv[ids.reshape(-1), t].reshape(ids.shape) for t, ids in enumerate(chains)],
        [ret[ids.reshape(-1), t].reshape(ids.shape) for t, ids in enumerate(chains)],
    )


def _length_metrics(completions: list[Completion], prefix: str) -> dict[str, float]:
    """Mean length (tokens) and the fraction cut at ``max_new_tokens`` before EOS."""
    lengths = [len(c.completion_ids) for c in completions]
    cut = sum(not c.finished for c in completions)
    return {
        f"{prefix}length_mean": sum(lengths) / len(lengths),
        f"{prefix}clipped_fraction": cut / len(completions),
    }


def round_metrics(tree: RolloutTree, joint: list[Tensor]) -> dict[str, float]:
    """A round's ``turn_k/reward_mean`` and ``turn_k/expected_return`` (every joint action of
    turn k, ``joint`` from :func:`joint_returns`), and what its completions look like:
    ``completions/length_{mean,min,max}`` (tokens) and ``completions/clipped_fraction`` (cut at
    ``max_new_tokens`` before EOS), over every agent's completions, and with several agents
    ``agent_i/completions/length_mean`` and ``agent_i/completions/clipped_fraction`` for each."""
    metrics = {}
    for level, returns in zip(tree.levels, joint, strict=True):
        metrics[turn_key(level.turn, "reward_mean")] = float(level.rewards.mean())
        metrics[turn_key(level.turn, "expected_return")] = float(returns.mean())
    by_agent: dict[int, list[Completion]] = {}
    for level in tree.levels:
        for agent, agent_rows in enumerate(level.completions):
            by_agent.setdefault(agent, []).extend(c for samples in agent_rows for c in samples)
    completions = [c for agent_completions in by_agent.values() for c in agent_completions]
    if completions:
        metrics.update(_length_metrics(completions, "completions/"))
        lengths = [len(c.completion_ids) for c in completions]
        metrics["completions/length_min"] = float(min(lengths))
        metrics["completions/length_max"] = float(max(lengths))
    if len(by_agent) > 1:  # per agent too, so that a collapse shows which role moved
        for agent, own in by_agent.items():
            metrics.update(_length_metrics(own, f"agent_{agent}/completions/"))
    groups = [r for level, r in zip(tree.levels, joint, strict=True) if len(level.joints) > 1]
    if groups:
        # A group whose joint actions all got one return gives every sibling advantage 0: no
        # learning signal from that state (TRL's frac_reward_zero_std).
        flat = torch.cat([(r.amax(dim=1) - r.amin(dim=1)) == 0 for r in groups])
        metrics["groups/zero_spread_fraction"] = float(flat.float().mean())
    return metrics
