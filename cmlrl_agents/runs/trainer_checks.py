"""Checks of ``TeamTrainer``'s arguments: a given env or task against the config, reference
devices, per-agent sampling, and what ``train()`` is given."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cmlrl_agents.foundation.config import FROM_TASK, SharedConfig
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_env import TaskSpec

__all__ = [
    "check_agent_sampling",
    "check_given_task",
    "check_reference_devices",
    "resume_target",
    "train_kwargs_error",
]


def check_given_task(
    spec: TaskSpec, args: SharedConfig, given: tuple[Any, ...], label: str
) -> None:
    """A ready ``env=`` or ``task=`` (``label``) is the whole task: refuse task pieces passed
    beside it, and turns or a threshold that the config sets otherwise."""
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
    unset = {"num_turns": None, "early_termination_threshold": FROM_TASK}
    for name, default in unset.items():
        mine, theirs = getattr(args, name), getattr(spec, name)
        if mine != default and mine != theirs:
            raise ValueError(
                f"{label} has {name}={theirs!r} but args.{name}={mine!r}; the task owns it: "
                f"leave args.{name} unset ({default!r}) or make them equal."
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


# comlrl's train() took its checkpoint settings and extra generate() kwargs.
_COMLRL_TRAIN_KWARGS = {
    "checkpoint_dir": "args.output_dir (checkpoints go to output_dir/checkpoints/)",
    "checkpoint_interval": "args.save_steps (counted in training task items, not epochs)",
    "checkpoint_total_limit": "args.save_total_limit",
}


def train_kwargs_error(kwargs: dict[str, Any]) -> TypeError:
    """The error for keyword arguments that ``train()`` does not take, saying where each goes."""
    other = (
        "a config field if it is a generation setting (max_new_tokens, temperature, top_p, "
        "top_k, min_new_tokens); other generate() options are not supported"
    )
    parts = [f"{name} -> {_COMLRL_TRAIN_KWARGS.get(name, other)}" for name in kwargs]
    return TypeError("train() takes only resume_from_checkpoint; got " + "; ".join(parts) + ".")


def resume_target(value: Any) -> str | Path | None:
    """``resume_from_checkpoint`` as a folder, ``"latest"`` or None; ``True`` means "latest"
    and ``False`` None (the Hugging Face idiom)."""
    if value is True:
        return "latest"
    if value is None or value is False:
        return None
    if isinstance(value, (str, Path)) and str(value):
        return value
    raise TypeError(
        f"resume_from_checkpoint must be a checkpoint folder, 'latest', True (= 'latest') or "
        f"None, got {value!r}."
    )
