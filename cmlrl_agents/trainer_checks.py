"""Construction checks of ``TeamTrainer``: a given env against the config, reference devices."""

from __future__ import annotations

from typing import Any

from cmlrl_agents.config import SharedConfig
from cmlrl_agents.devices import resolve_devices
from cmlrl_env import CoMLRLEnv

__all__ = ["check_agent_sampling", "check_given_env", "check_reference_devices"]


def check_given_env(env: CoMLRLEnv, args: SharedConfig, given: tuple[Any, ...]) -> None:
    """A ready ``env=`` is the whole task: refuse task pieces passed beside it, and settings
    that disagree with the config."""
    if any(g is not None for g in given):
        raise ValueError(
            "env= already holds the dataset, formatters, reward_func, "
            "reward_processor and external_transition; pass them to CoMLRLEnv, "
            "not to the trainer as well."
        )
    if env.source.item_order != "dataset":
        raise ValueError(
            f"env has item_order={env.source.item_order!r}, but trainers read the task items "
            "in dataset order (SPEC §2); build the env with item_order='dataset' and "
            "shuffle the dataset itself (train_dataset.shuffle(seed=42)) for another order."
        )
    task = env.task
    for name in ("num_turns", "early_termination_threshold"):
        if getattr(task, name) != getattr(args, name):
            raise ValueError(
                f"env has {name}={getattr(task, name)!r} but args.{name}="
                f"{getattr(args, name)!r}; make them equal."
            )


def check_reference_devices(args: SharedConfig, num_agents: int) -> None:
    if args.reference_devices is not None and not args.to_dict().get("reference_kl_enabled"):
        raise ValueError(
            f"reference_devices={args.reference_devices!r} places the frozen reference "
            "models, which exist only with reference_kl_enabled=True; set that or drop "
            "reference_devices."
        )
    resolve_devices(args.reference_devices, num_agents, "reference_devices")  # before loading


def check_agent_sampling(args: SharedConfig, num_agents: int) -> None:
    """``args.agent_sampling`` has one entry per agent of the team."""
    given = args.agent_sampling
    if given is not None and len(given) != num_agents:
        raise ValueError(
            f"args.agent_sampling has {len(given)} entries for {num_agents} agents; give one "
            "dict per agent ({} keeps the shared settings)."
        )
