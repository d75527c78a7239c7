"""What a trainer is built from, worked out before any model loads: the team size every
source agrees on, the run's one task spec and the evaluation env (pure functions)."""

from __future__ import annotations

from typing import Any

from cmlrl_agents.foundation.config import SharedConfig
from cmlrl_agents.policies.build import resolve_num_agents
from cmlrl_agents.runs.trainer_checks import check_given_task
from cmlrl_env import CoMLRLEnv, TaskSpec

__all__ = ["eval_env", "task_spec", "team_size"]


def team_size(
    args: SharedConfig, num_agents: int | None, agents: Any, formatters: Any, spec: Any
) -> int:
    """The team size every given source agrees on; ``spec`` is the ``task=`` or the
    ``env=``'s spec."""
    if spec is not None and not isinstance(spec, TaskSpec):
        raise TypeError(f"task must be a cmlrl_env.TaskSpec, got {type(spec).__name__}.")
    return resolve_num_agents(
        num_agents=num_agents,
        **{"args.num_agents": args.num_agents},
        agents=None if agents is None else len(agents),
        formatters=len(formatters) if isinstance(formatters, (list, tuple)) else None,
        task=None if spec is None else spec.num_agents,
    )


def task_spec(
    args: SharedConfig,
    env: CoMLRLEnv | None,
    task: TaskSpec | None,
    given: tuple[Any, ...],
    eval_dataset: Any,
    num_agents: int,
) -> TaskSpec | None:
    """The one ``TaskSpec`` of the run: ``env.spec``, ``task=``, or built from the seed's
    keyword arguments (``given``: dataset, formatters, reward, processor, transition) and the
    config's turns and threshold (``task_settings``); without a reward, None (a trainer that
    only saves). From here on the spec alone owns ``num_turns`` and the termination
    threshold."""
    if env is not None and task is not None:
        raise ValueError("pass env= or task=, not both (env.spec is the env's task).")
    if env is not None or task is not None:
        label = "env" if env is not None else "task"
        spec = env.spec if env is not None else task
        assert spec is not None
        check_given_task(spec, args, given, label)
        return spec
    dataset, formatters, reward_func, processor, transition = given
    if reward_func is None:
        if dataset is not None or eval_dataset is not None:
            raise ValueError("reward_func is required (or pass env=CoMLRLEnv(...)).")
        return None
    return TaskSpec(
        dataset,
        formatters,
        reward_func,
        reward_processor=processor,
        external_transition=transition,
        num_agents=num_agents,
        **args.task_settings(),
    )


def eval_env(spec: TaskSpec | None, eval_dataset: Any) -> CoMLRLEnv | None:
    """The task over ``eval_dataset`` with early termination off: evaluation plays every turn,
    so custom eval metrics always see ``[agent][item][turn]`` for each turn; the standard
    metrics still score each item as training's early termination would
    (``evaluation.eval_values``)."""
    if eval_dataset is None or spec is None:
        return None
    return CoMLRLEnv.from_spec(spec.replace(dataset=eval_dataset, early_termination_threshold=None))
