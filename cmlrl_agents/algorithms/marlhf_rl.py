"""MARLHF's RL phase: which trainer, its config, its own keyword arguments, its task.

The RL phase is an ordinary trainer of ``RL_TRAINERS`` (MAGRPO family, IAC, MAAC) built over
MARLHF's agents and training task, with the reward model as its reward. What only that trainer
takes (``critic_model``, ``critics``, ``metrics_callback`` for IAC/MAAC; ``eval_logger``,
``eval_aggregator`` for the MAGRPO family) is passed as one ``rl_options`` dict, checked
against that trainer's signature before any model loads.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cmlrl_agents.algorithms.actor_critic import IACTrainer, MAACTrainer
from cmlrl_agents.algorithms.magrpo import (
    MAGRPOTrainer,
    MAREINFORCETrainer,
    MAReMaxTrainer,
    MARLOOTrainer,
)
from cmlrl_agents.algorithms.preference_config import RL_CONFIGS, SHARED_FIELDS, MARLHFConfig
from cmlrl_agents.runs.trainer import TeamTrainer
from cmlrl_agents.runs.trainer_keywords import TeamKeywords

__all__ = ["RL_OPTION_NAMES", "RL_TRAINERS", "check_rl_options", "refuse_rl_options", "rl_config"]

RL_TRAINERS: dict[str, type[TeamTrainer[Any, Any]]] = {
    "magrpo": MAGRPOTrainer,
    "mareinforce": MAREINFORCETrainer,
    "maremax": MAReMaxTrainer,
    "marloo": MARLOOTrainer,
    "iac": IACTrainer,
    "maac": MAACTrainer,
}
"""The RL phase's trainer by ``rl_algorithm`` (its config class: ``RL_CONFIGS``)."""


def _own_options(trainer_class: type) -> list[str]:
    """The keyword-only arguments of a trainer besides ``args``: its options beyond the team."""
    params = inspect.signature(trainer_class).parameters.values()
    return [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name != "args"]


RL_OPTION_NAMES = tuple(dict.fromkeys(n for c in RL_TRAINERS.values() for n in _own_options(c)))
"""Every RL trainer's own options (what goes in ``rl_options``)."""


def refuse_rl_options(team: Mapping[str, Any]) -> None:
    """An RL trainer's option passed to MARLHFTrainer itself (as comlrl took ``critic_model``)
    is a TypeError that says where it goes."""
    misplaced = [k for k in team if k in RL_OPTION_NAMES]
    if misplaced:
        shown = ", ".join(f"{k!r}: ..." for k in misplaced)
        raise TypeError(
            f"MARLHFTrainer() got {misplaced}, which are options of its RL phase's trainer; "
            f"pass them as rl_options={{{shown}}}."
        )


def check_rl_options(options: Mapping[str, Any] | None, rl_algorithm: str) -> dict[str, Any]:
    """``rl_options`` as keyword arguments of the ``rl_algorithm`` trainer: a dict whose names
    that trainer takes, and none of the team's (the RL phase shares MARLHF's team and task)."""
    if options is None:
        return {}
    trainer_class = RL_TRAINERS[rl_algorithm]
    accepted = _own_options(trainer_class)
    if not isinstance(options, Mapping):
        raise TypeError(
            f"rl_options must be a dict of {trainer_class.__name__}'s own keyword arguments "
            f"({accepted}), got {type(options).__name__}."
        )
    shared = [k for k in options if k in TeamKeywords.__annotations__ or k == "agent_model"]
    if shared:
        raise TypeError(
            f"rl_options has {shared}, which the RL phase shares with MARLHFTrainer; pass "
            "them to MARLHFTrainer itself."
        )
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise TypeError(
            f"rl_options has {unknown}, which {trainer_class.__name__} "
            f"(rl_algorithm={rl_algorithm!r}) does not take; it takes {accepted}."
        )
    return dict(options)


def rl_config(args: MARLHFConfig, run_dir: Path) -> Any:
    """The RL phase's config: a copy of ``args.rl_args`` (or the algorithm's defaults) with
    ``output_dir`` ``<run_dir>/rl``, MARLHF's seed unless given, and MARLHF's generation
    settings and termination threshold (``SHARED_FIELDS``: the config refused rl_args that set
    others)."""
    # MARLHFConfig checked rl_args against rl_algorithm when it was built or assigned.
    config_class = RL_CONFIGS[args.rl_algorithm]
    rl = config_class() if args.rl_args is None else copy.deepcopy(args.rl_args)
    if rl.output_dir is None:
        rl.output_dir = str(run_dir / "rl")
    if rl.seed is None:
        rl.seed = args.seed
    for name in SHARED_FIELDS:
        setattr(rl, name, copy.deepcopy(getattr(args, name)))
    return rl
