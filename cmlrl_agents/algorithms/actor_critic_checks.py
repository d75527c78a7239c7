"""IAC/MAAC critic arguments, checked before any model is loaded (pure functions).

A mistake in ``critic_model=`` / ``critics=`` / ``critic_devices`` must not cost the minutes of
loading the actors first: :func:`check_critic_args` runs at the top of the trainer's constructor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cmlrl_agents.algorithms.actor_critic_config import ActorCriticConfig
from cmlrl_agents.policies.devices import resolve_devices
from cmlrl_agents.runs.run_dirs import model_name

__all__ = ["check_critic_args", "critic_names"]


def check_critic_args(
    trainer: Any,
    args: ActorCriticConfig,
    critic_model: Any,
    critics: Sequence[Any] | None,
    num_agents: int,
) -> int:
    """The number of separate critics the arguments give (0: value heads on the actors);
    ``trainer`` is the IAC/MAAC trainer being built (its class says which)."""
    centralized: bool = trainer.centralized
    name = type(trainer).__name__
    given = critic_model is not None or critics is not None
    separate = centralized or args.to_dict()["use_separate_critic"]
    if not separate:
        if given:
            raise ValueError(
                "use_separate_critic=False puts the value head on each actor, so "
                "critic_model/critics would be unused; drop them or set "
                "use_separate_critic=True."
            )
        if args.critic_devices is not None:
            raise ValueError(
                f"critic_devices={args.critic_devices!r} places separate critics, but with "
                "use_separate_critic=False each value head lives on its actor (see "
                "agent_devices); drop critic_devices."
            )
        return 0
    if not given:
        raise ValueError(
            "MAACTrainer needs its centralised critic: pass critic_model='<name or "
            "folder>' or critics=[model]."
            if centralized
            else "use_separate_critic=True needs critic_model='<name or folder>' or "
            "critics=[one model per agent]; or set IACConfig(use_separate_critic=False) "
            "for a value head on each actor."
        )
    count = 1 if centralized else num_agents
    if critic_model is not None and critics is not None:
        raise ValueError("pass critic_model (one for every critic) or critics (a list), not both.")
    if critic_model is not None and not isinstance(critic_model, str) and count > 1:
        raise ValueError(
            f"critic_model is one model object but {count} critics are needed; pass "
            "critics=[one model per agent] or a model name."
        )
    if critics is not None:
        if isinstance(critics, str) or not isinstance(critics, Sequence):
            raise TypeError(
                f"critics must be a list of models, got {type(critics).__name__}; pass a name "
                "as critic_model='...'."
            )
        if len(critics) != count:
            raise ValueError(
                f"critics has {len(critics)} model(s); {name} needs {count} (one per "
                f"{'agent' if count > 1 else 'team'})."
            )
    resolve_devices(args.critic_devices, count, "critic_devices", "critic")
    return count


def critic_names(critic_model: Any, critics: Sequence[Any] | None, count: int) -> list[str]:
    """The critics' model names for the run config ("value head" entries when on the actors)."""
    if count == 0:
        return []
    if critics is not None:
        return [model_name(c) for c in critics]
    return [model_name(critic_model)] * count
