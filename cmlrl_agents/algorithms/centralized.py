"""``CentralizedMAGRPOTrainer``: one policy writes every role's output in one completion.

The one-model baseline of a team task (comlrl has it too): the roles' prompts (from the task's
per-role formatters) are joined into one prompt (``joint_prompt``) that asks for each role's
output under a heading, ``Task 1: …`` / ``Task 2: …``, a form an untrained small model follows
on most completions; the completion is split at the headings (``split_roles``) and the role
outputs are scored by the team's own reward. A completion that does not parse (a role's answer
missing or empty) is not scored by the reward: it gets ``args.parse_failure_reward`` (default
-1.0, below the built-in tasks' minimum of 0). Training is MAGRPO with one agent; one turn only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

from cmlrl_agents.algorithms.magrpo import MAGRPOTrainer, eval_chains
from cmlrl_agents.algorithms.magrpo_config import MAGRPOConfig
from cmlrl_agents.foundation.rollout import RolloutTree
from cmlrl_agents.runs.trainer_checks import check_given_task
from cmlrl_agents.runs.trainer_keywords import TASK_PIECES, TeamKeywords, check_team_keywords
from cmlrl_env import Formatters, RewardFunction, TaskSpec

__all__ = [
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "JointFormatter",
    "JointReward",
    "joint_prompt",
    "split_roles",
]


ANSWER_HEADING = "Task {n}:"
"""The line that opens role ``n - 1``'s output in a joint completion (roles count from 1 there)."""
_HEADING = re.compile(r"^[ \t>#*_]*(?:task|answer)[ \t]*(\d+)[ \t*_]*[:.)\-][ \t*_]*", re.I | re.M)


def joint_prompt(role_prompts: Sequence[str]) -> str:
    """One prompt for every role: the context the role prompts share (the whole paragraphs
    they all end with, e.g. the problem or the passage) once, then each role's own instruction
    as a numbered task, then the answer form with one heading per role (``Task 1:``,
    ``Task 2:``, ...), last, where a small model reads it just before it writes."""
    n = len(role_prompts)
    shared = _shared_context(role_prompts)
    tasks = [p[: len(p) - len(shared)].strip() for p in role_prompts]
    parts = [shared.strip()] if shared.strip() else []
    parts.append(
        f"Do these {n} tasks{' on the text above' if shared.strip() else ''}:\n"
        + "\n".join(f"{k}. {task}" for k, task in enumerate(tasks, 1))
    )
    form = "\n".join(
        f"{ANSWER_HEADING.format(n=r + 1)} <your answer to task {r + 1}>" for r in range(n)
    )
    parts.append(f"Reply in exactly this form, one answer under each heading:\n{form}")
    return "\n\n".join(parts)


def _shared_context(prompts: Sequence[str]) -> str:
    """The longest run of whole paragraphs (split at blank lines) that every prompt ends with;
    ``""`` for one prompt, or when it would leave a prompt without its own instruction."""
    if len(prompts) < 2:
        return ""
    split = [p.split("\n\n") for p in prompts]
    count = 0
    while all(len(s) > count + 1 for s in split) and len({s[-1 - count] for s in split}) == 1:
        count += 1
    return "\n\n".join(split[0][len(split[0]) - count :]) if count else ""


def split_roles(text: str, num_roles: int) -> list[str] | None:
    """Each role's output (stripped), or ``None`` when the completion does not hold one
    non-empty answer per role.

    Headings are lines that start with ``Task k`` or ``Answer k`` (any case, markdown marks
    around them allowed) followed by ``:``, ``.``, ``)`` or ``-``. Role ``r``'s answer is the
    text after the first heading numbered ``r + 1`` that follows role ``r - 1``'s heading, up to
    the next heading of any number; headings after the last role's answer (a model that
    repeats the form) are ignored. Without any heading, a completion of exactly ``num_roles``
    fenced code blocks gives one block per role, in order."""
    heads = list(_HEADING.finditer(text))
    if not heads:
        blocks = re.findall(r"```[^\n]*\n.*?(?:```|\Z)", text, flags=re.S)
        outputs = [b.strip() for b in blocks] if len(blocks) == num_roles else []
        return outputs if outputs and all(outputs) else None
    outputs, want = [], 1
    for i, head in enumerate(heads):
        if int(head.group(1)) != want:
            continue
        end = heads[i + 1].start() if i + 1 < len(heads) else len(text)
        outputs.append(text[head.end() : end].strip())
        want += 1
        if want > num_roles:
            break
    return outputs if len(outputs) == num_roles and all(outputs) else None


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

    def __call__(
        self, completions: Sequence[str], *, batch_items: Sequence[Mapping[str, Any]]
    ) -> list[float]:
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
        if self.num_turns not in (None, 1):
            raise ValueError(
                f"CentralizedMAGRPOConfig.num_turns={self.num_turns}: the centralized baseline "
                "plays one turn; set num_turns=1 or None."
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
        *,
        eval_logger: Callable[..., Any] | None = None,
        eval_aggregator: Callable[..., Any] | None = None,
        args: CentralizedMAGRPOConfig | None = None,
        num_roles: int | None = None,
        **team: Unpack[TeamKeywords],
    ) -> None:
        args = CentralizedMAGRPOConfig() if args is None else args
        if not isinstance(args, CentralizedMAGRPOConfig):
            raise TypeError(f"args must be a CentralizedMAGRPOConfig, got {type(args).__name__}.")
        # One policy for every role: the team size is 1 and the roles are num_roles.
        check_team_keywords(team, type(self).__name__, refused=("num_agents", "env"))
        rest: dict[str, Any] = dict(team)  # the team's keywords, with the task's made joint
        task: TaskSpec | None = rest.pop("task", None)
        if task is not None and task.num_turns != 1:
            raise ValueError(
                f"task has num_turns={task.num_turns}: the centralized baseline plays one turn; "
                "give it a one-turn task."
            )
        given = tuple(rest.pop(k, None) for k in TASK_PIECES)
        formatters, reward_func = _team_pieces(task, args, given)
        counted = len(formatters) if isinstance(formatters, (list, tuple)) else None
        roles = counted if task is None else task.num_agents
        self.num_roles = _resolve_roles(num_roles, args.num_roles, roles)
        joint = {
            "formatters": JointFormatter(formatters, self.num_roles),
            "reward_func": JointReward(reward_func, self.num_roles, args.parse_failure_reward),
        }
        if task is None:
            rest.update(train_dataset=given[0], reward_processor=given[3], **joint)
        else:
            rest["task"] = task.replace(num_agents=1, **joint)  # its limits and options stay
        super().__init__(
            agent_model,
            num_agents=1,
            eval_logger=eval_logger,
            eval_aggregator=eval_aggregator,
            args=args,
            **rest,
        )

    def _logged_roles(self, chains: list[list[list[str]]]) -> list[list[list[str]]]:
        """The one model's chains split into the roles (``""`` for an unparsable text)."""
        roles: list[list[list[str]]] = [[] for _ in range(self.num_roles)]
        for chain in chains[0]:
            split = [split_roles(text, self.num_roles) for text in chain]
            for r in range(self.num_roles):
                roles[r].append(["" if s is None else s[r] for s in split])
        return roles

    def _custom_eval_metrics(self, trees: list[RolloutTree]) -> dict[str, float]:
        if self.eval_logger is None or self.eval_aggregator is None:
            return {}
        chains: list[list[str]] = []
        items: list[Mapping[str, Any]] = []
        for tree in trees:
            chains.extend(eval_chains(tree)[0])
            items.extend(item for item, _ in tree.items)
        rows = self.eval_logger(
            agent_completions_turns=self._logged_roles([chains]),
            batch_items=items,
            prompts=[item.get("prompt") for item in items],
        )
        metrics = dict(self.eval_aggregator(rows, num_turns=self.num_turns))
        parsed = [
            split_roles(t, self.num_roles) is not None
            for tree in trees
            for c in eval_chains(tree)[0]
            for t in c
        ]
        metrics["parse_rate"] = sum(parsed) / max(len(parsed), 1)
        return metrics


def _team_pieces(
    task: TaskSpec | None, args: CentralizedMAGRPOConfig, given: tuple[Any, ...]
) -> tuple[Any, Callable[..., Any]]:
    """The team task's (formatters, reward_func), from ``task=`` (the team task whole, whose
    pieces go through the joint wrappers) or the keywords; one turn, a reward."""
    _, formatters, reward_func, _, external_transition = given
    if task is not None:
        check_given_task(task, args, given, "task")
        formatters, reward_func = task.formatters, task.reward_func
        external_transition = task.external_transition
    if external_transition is not None:
        raise ValueError(
            "CentralizedMAGRPOTrainer plays one turn and takes no external_transition; "
            "drop it (or train the team with MAGRPOTrainer)."
        )
    if reward_func is None:
        raise ValueError("reward_func is required: the team task's reward, one list per role.")
    return formatters, reward_func


def _resolve_roles(given: int | None, configured: int | None, counted: int | None) -> int:
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
