"""``CentralizedMAGRPOTrainer``: one policy writes every role's output in one completion.

The one-model baseline of a team task (comlrl has it too): the roles' prompts (from the task's
per-role formatters) are joined into one prompt that asks for each role's output between role
markers, ``<agent_0>…</agent_0><agent_1>…</agent_1>…``; the completion is split at the markers
and the role outputs are scored by the team's own reward. A completion that does not parse
(a marker missing or repeated) is not scored by the reward: it gets
``args.parse_failure_reward`` (default -1.0, below the built-in tasks' minimum of 0), so the
policy learns the format instead of feeding empty roles to the reward. Training is MAGRPO with
one agent; one turn only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cmlrl_agents.magrpo import MAGRPOTrainer, eval_chains
from cmlrl_agents.magrpo_config import MAGRPOConfig
from cmlrl_agents.rollout import RolloutTree
from cmlrl_env import Formatters, RewardFunction

__all__ = [
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "JointFormatter",
    "JointReward",
    "joint_prompt",
    "split_roles",
]


def _tag(role: int) -> str:
    return f"agent_{role}"


def joint_prompt(role_prompts: Sequence[str]) -> str:
    """One prompt asking for every role's output between its markers, in order."""
    parts = [
        f"You write the answers of {len(role_prompts)} roles. Put each role's answer between its "
        "markers, in this order: "
        + "".join(f"<{_tag(r)}>...</{_tag(r)}>" for r in range(len(role_prompts)))
        + "."
    ]
    for r, prompt in enumerate(role_prompts):
        parts.append(f"Role {r} (<{_tag(r)}>):\n{prompt}")
    return "\n\n".join(parts)


def split_roles(text: str, num_roles: int) -> list[str] | None:
    """Each role's output (stripped), or ``None`` when a role's markers are missing or appear
    more than once."""
    outputs = []
    for r in range(num_roles):
        found = re.findall(rf"<{_tag(r)}>(.*?)</{_tag(r)}>", text, flags=re.S)
        if len(found) != 1:
            return None
        outputs.append(found[0].strip())
    return outputs


class JointFormatter:
    """The per-role formatters of a team task as the one formatter of the joint policy."""

    def __init__(self, formatters: Any, num_roles: int) -> None:
        self.roles = Formatters(formatters, num_roles)
        self.num_roles = num_roles

    def __call__(self, item: Mapping[str, Any]) -> str:
        return joint_prompt([self.roles.format(r, item) for r in range(self.num_roles)])


class JointReward:
    """The team reward on split completions; unparsable ones get ``parse_failure_reward``."""

    def __init__(
        self, reward_func: Callable[..., Any], num_roles: int, parse_failure_reward: float
    ):
        self.reward = RewardFunction(reward_func, num_roles)
        self.num_roles = num_roles
        self.parse_failure_reward = parse_failure_reward
        self.__name__ = f"joint({self.reward.name})"

    def __call__(self, completions: Sequence[str], *, batch_items: Sequence[Mapping[str, Any]]):
        parsed = [split_roles(c, self.num_roles) for c in completions]
        ok = [p for p in parsed if p is not None]
        scores = iter(
            self.reward([[p[r] for p in ok] for r in range(self.num_roles)], batch_items[0])
            if ok
            else []
        )
        return [self.parse_failure_reward if p is None else next(scores) for p in parsed]


@dataclass
class CentralizedMAGRPOConfig(MAGRPOConfig):
    """MAGRPO settings of the one joint policy, plus the roles."""

    num_roles: int | None = None
    """Roles the policy writes; None takes the number of formatters."""
    parse_failure_reward: float = -1.0
    """Reward of a completion whose role markers do not parse."""

    def validate(self) -> None:
        super().validate()
        self._int("num_roles", 1, optional=True)
        self._real("parse_failure_reward")
        if self.num_turns != 1:
            raise ValueError(
                f"CentralizedMAGRPOConfig.num_turns={self.num_turns}: the centralized baseline "
                "plays one turn; set num_turns=1."
            )
        if self.num_agents not in (None, 1):
            raise ValueError(
                f"CentralizedMAGRPOConfig.num_agents={self.num_agents}: the centralized trainer "
                "trains one policy; set num_roles for the number of roles and leave num_agents "
                "unset (or 1)."
            )


class CentralizedMAGRPOTrainer(MAGRPOTrainer):
    """One model for every role: see the module docstring.

    Takes the team task's pieces (``formatters`` = one per role, ``reward_func`` with one list
    per role) and one model: ``agent_model=...`` or ``agents=[model]`` (+ ``tokenizer``).
    ``eval_logger`` receives the split role outputs (``""`` for an unparsable completion).
    """

    algorithm = "magrpo_centralized"
    config_class = CentralizedMAGRPOConfig

    def __init__(
        self,
        agent_model: Any = None,
        agents: Sequence[Any] | None = None,
        tokenizer: Any = None,
        model_config: Mapping[str, Any] | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        reward_func: Callable[..., Any] | None = None,
        reward_processor: Callable[[float], float] | None = None,
        formatters: Any = None,
        external_transition: Callable[..., Any] | None = None,
        wandb_config: Mapping[str, Any] | None = None,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: CentralizedMAGRPOConfig | None = None,
        num_roles: int | None = None,
        peft_config: Any = None,
    ) -> None:
        args = CentralizedMAGRPOConfig() if args is None else args
        if not isinstance(args, CentralizedMAGRPOConfig):
            raise TypeError(f"args must be a CentralizedMAGRPOConfig, got {type(args).__name__}.")
        if external_transition is not None:
            raise ValueError(
                "CentralizedMAGRPOTrainer plays one turn and takes no external_transition; "
                "drop it (or train the team with MAGRPOTrainer)."
            )
        if reward_func is None:
            raise ValueError("reward_func is required: the team task's reward, one list per role.")
        self.num_roles = _resolve_roles(num_roles, args.num_roles, formatters)
        super().__init__(
            agent_model=agent_model,
            agents=agents,
            num_agents=1,
            tokenizer=tokenizer,
            model_config=model_config,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            reward_func=JointReward(reward_func, self.num_roles, args.parse_failure_reward),
            reward_processor=reward_processor,
            formatters=JointFormatter(formatters, self.num_roles),
            wandb_config=wandb_config,
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
            args=args,
            peft_config=peft_config,
        )

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        if self.eval_logger is None or self.eval_aggregator is None:
            return {}
        roles: list[list[list[str]]] = [[] for _ in range(self.num_roles)]
        items: list[Mapping[str, Any]] = []
        for tree in trees:
            for chain in eval_chains(tree)[0]:
                split = [split_roles(text, self.num_roles) for text in chain]
                for r in range(self.num_roles):
                    roles[r].append(["" if s is None else s[r] for s in split])
            items.extend(item for item, _ in tree.items)
        rows = self.eval_logger(
            agent_completions_turns=roles,
            batch_items=items,
            prompts=[item.get("prompt") for item in items],
        )
        metrics = dict(self.eval_aggregator(rows, num_turns=self.args.num_turns))
        parsed = [
            split_roles(t, self.num_roles) is not None
            for tree in trees
            for c in eval_chains(tree)[0]
            for t in c
        ]
        metrics["parse_rate"] = sum(parsed) / max(len(parsed), 1)
        return metrics


def _resolve_roles(given: int | None, configured: int | None, formatters: Any) -> int:
    counted = len(formatters) if isinstance(formatters, (list, tuple)) else None
    values = {
        k: v
        for k, v in (("num_roles", given), ("args.num_roles", configured), ("formatters", counted))
        if v is not None
    }
    if not values:
        raise ValueError(
            "CentralizedMAGRPOTrainer needs the number of roles: pass one formatter per role "
            "(formatters=[...]) or num_roles=N."
        )
    if len(set(values.values())) > 1:
        raise ValueError(f"the number of roles disagrees: {values}; make them equal.")
    return next(iter(values.values()))
