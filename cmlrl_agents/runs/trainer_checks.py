"""Construction checks of ``TeamTrainer``: a given env or task against the config, reference
devices."""

from __future__ import annotations

from typing import Any

from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.runs.config import SharedConfig
from cmlrl_env import TaskSpec

__all__ = ["check_agent_sampling", "check_given_task", "check_reference_devices"]


def check_given_task(
    spec: TaskSpec, args: SharedConfig, given: tuple[Any, ...], label: str
) -> None:
    """A ready ``env=`` or ``task=`` (``label``) is the whole task: refuse task pieces passed
    beside it, and settings that disagree with the config."""
    if any(g is not None for g in given):
        raise ValueError(
            f"{label}= already holds the dataset, formatters, reward_func, "
            "reward_processor and external_transition; pass them to "
            f"{'CoMLRLEnv' if label == 'env' else 'TaskSpec'}, not to the trainer as well."
        )
    if spec.item_order != "dataset":
        raise ValueError(
            f"{label} has item_order={spec.item_order!r}, but trainers read the task items "
            "in dataset order (SPEC §2); build it with item_order='dataset' and "
            "shuffle the dataset itself (train_dataset.shuffle(seed=42)) for another order."
        )
    for name in ("num_turns", "early_termination_threshold"):
        if getattr(spec, name) != getattr(args, name):
            raise ValueError(
                f"{label} has {name}={getattr(spec, name)!r} but args.{name}="
                f"{getattr(args, name)!r}; make them equal."
            )


def check_reference_devices(args: SharedConfig, num_agents: int) -> None:
    # A config without the reference_kl_enabled switch always has references (MADPO's DPO).
    if args.reference_devices is not None and args.to_dict().get("reference_kl_enabled") is False:
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
