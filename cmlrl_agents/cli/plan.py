"""The plan of a ``cmlrl`` run file: every section checked, then the trainer built from it.

``plan(spec)`` validates the sections and resolves the task without loading a model;
``build_trainer(plan)`` loads the models and constructs the trainer. The commands that use them
live in :mod:`cmlrl_agents.cli.commands`.
"""

from __future__ import annotations

import difflib
import importlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cmlrl_agents.cli.adapters import peft_section
from cmlrl_agents.cli.tasks import (
    SECTIONS,
    TRAINER_CALLBACKS,
    CLIError,
    TaskSection,
    build_task,
    check_keys,
)
from cmlrl_agents.foundation.config import SharedConfig
from cmlrl_agents.policies.model_keys import MODEL_CONFIG_KEYS
from cmlrl_agents.runs.logging_config import WANDB_CONFIG_KEYS

__all__ = [
    "ALGORITHMS",
    "BUILTIN_MODELS",
    "CONFIGS",
    "TRAINER_TAKES",
    "MODEL_KEYS",
    "Plan",
    "build_trainer",
    "config_class",
    "plan",
    "trainer_class",
]

# Imported on use: the actor-critic trainers may be missing from an installation.
ALGORITHMS = {
    "magrpo": "cmlrl_agents.algorithms.magrpo:MAGRPOTrainer",
    "mareinforce": "cmlrl_agents.algorithms.magrpo:MAREINFORCETrainer",
    "maremax": "cmlrl_agents.algorithms.magrpo:MAReMaxTrainer",
    "marloo": "cmlrl_agents.algorithms.magrpo:MARLOOTrainer",
    "iac": "cmlrl_agents.algorithms.actor_critic:IACTrainer",
    "maac": "cmlrl_agents.algorithms.actor_critic:MAACTrainer",
    "magrpo_centralized": "cmlrl_agents.algorithms.centralized:CentralizedMAGRPOTrainer",
}
# Each algorithm's config class, imported without its trainer: `cmlrl check` reads the config
# section without loading torch (a test checks each against its trainer's config_class).
CONFIGS = {
    "magrpo": "cmlrl_agents.algorithms.magrpo_config:MAGRPOConfig",
    "mareinforce": "cmlrl_agents.algorithms.magrpo_config:MAREINFORCEConfig",
    "maremax": "cmlrl_agents.algorithms.magrpo_config:MAReMaxConfig",
    "marloo": "cmlrl_agents.algorithms.magrpo_config:MARLOOConfig",
    "iac": "cmlrl_agents.algorithms.actor_critic_config:IACConfig",
    "maac": "cmlrl_agents.algorithms.actor_critic_config:MAACConfig",
    "magrpo_centralized": "cmlrl_agents.algorithms.centralized:CentralizedMAGRPOConfig",
}
# The trainer keywords a run file can fill beyond the team and task (its task's callbacks, a
# critic), per algorithm: the run file's fit is checked without importing the trainer (a test
# compares them with the trainers' signatures).
_GRPO_TAKES = ("eval_logger", "eval_aggregator")
_CRITIC_TAKES = ("metrics_callback", "critic_model")
TRAINER_TAKES = {
    **dict.fromkeys(("magrpo", "mareinforce", "maremax", "marloo"), _GRPO_TAKES),
    "iac": _CRITIC_TAKES,
    "maac": _CRITIC_TAKES,
    "magrpo_centralized": _GRPO_TAKES,
}
# Algorithms that train one model for every role of the task.
SINGLE_POLICY_ALGORITHMS = ("magrpo_centralized",)
BUILTIN_MODELS = ("tiny", "smollm2")
DTYPES = ("float32", "float16", "bfloat16", "float64", "float", "half", "double", "auto")
"""``model.dtype`` names (``torch.`` before them allowed): torch's floating dtypes, or auto."""
TINY_UNUSED = ("dtype", "torch_dtype", "gguf_file", "model_kwargs", "cache_dir")
"""The model keys that the built-in tiny model has no use for (it takes chat_template,
system_prompt and device)."""
_DEVICE = re.compile(r"(cpu|cuda|mps|xpu|npu|hpu|meta)(:\d+)?|auto")
MODEL_KEYS = ("name_or_path", "critic_name_or_path", *MODEL_CONFIG_KEYS)


def trainer_class(name: Any) -> type:
    """The trainer registered under ``name`` (imported now)."""
    return _registered(ALGORITHMS, name)


def config_class(name: Any) -> type[SharedConfig]:
    """The config class of algorithm ``name``, imported without its trainer."""
    return _registered(CONFIGS, name)


def _registered(table: Mapping[str, str], name: Any) -> Any:
    if not isinstance(name, str) or name not in table:
        raise CLIError(f"unknown algorithm {name!r}; valid: {', '.join(table)}.")
    module, _, attr = table[name].partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise CLIError(f"algorithm {name!r} is not available in this installation: {exc}") from None


@dataclass
class Plan:
    """A validated run file, before any model is loaded."""

    algorithm: str
    config: SharedConfig
    task: TaskSection
    model: dict[str, Any] | None
    wandb: dict[str, Any] | None
    peft: Any = None
    """The trainers' ``peft_config``: a ``peft.LoraConfig``, one per agent, or None."""

    @property
    def trainer_class(self) -> type:
        """The algorithm's trainer (imported on first use, with torch)."""
        return trainer_class(self.algorithm)


def plan(spec: Mapping[str, Any], *, need_model: bool = True, source: str = "the run file") -> Plan:
    """Check every section of ``spec`` (read from ``source``, named in errors) and resolve the
    task; loads no model."""
    check_keys(spec, SECTIONS, "section")
    algorithm = spec.get("algorithm", "magrpo")
    cls = config_class(algorithm)
    task = build_task(spec.get("task"))
    config = _config(cls, spec.get("config"), task.config_defaults)
    wandb = spec.get("wandb")
    if wandb is False:
        wandb = None
    if wandb is not None:
        if not isinstance(wandb, Mapping):
            raise CLIError(f"wandb must be a mapping (or null to turn W&B off), got {wandb!r}.")
        check_keys(wandb, WANDB_CONFIG_KEYS, "wandb key")
    model = _model_section(spec.get("model")) if need_model or "model" in spec else None
    p = Plan(algorithm, config, task, model, None if wandb is None else dict(wandb))
    p.peft = peft_section(spec.get("peft"), source, _model_count(p))
    _check_fit(p)
    return p


def _model_count(p: Plan) -> int:
    """How many models (agents) the trainer gets: one for a single-policy algorithm."""
    if p.algorithm in SINGLE_POLICY_ALGORITHMS:
        return 1
    return p.config.num_agents or p.task.num_agents or 2


def _check_fit(p: Plan) -> None:
    """Refuse task callbacks and critics that the algorithm would not use."""
    params = TRAINER_TAKES[p.algorithm]
    for name in p.task.callbacks:
        if name not in params:
            takes = [c for c in TRAINER_CALLBACKS if c in params]
            raise CLIError(
                f"task.{name} is not used by algorithm {p.algorithm!r}; it takes {takes}."
            )
    if p.model and "critic_name_or_path" in p.model and not _num_critics(p, 1):
        why = " with use_separate_critic=false" if p.algorithm == "iac" else ""
        raise CLIError(f"model.critic_name_or_path is not used by algorithm {p.algorithm!r}{why}.")


def _config(cls: type[SharedConfig], section: Any, defaults: Mapping[str, Any]) -> SharedConfig:
    if section is not None and not isinstance(section, Mapping):
        raise CLIError(f"config must be a mapping of {cls.__name__} fields, got {section!r}.")
    try:  # an unknown field is refused by the config itself, naming TRL's names' counterparts
        return cls(**{**defaults, **(section or {})})
    except (TypeError, ValueError) as exc:
        raise CLIError(f"config: {exc}") from None


def _model_section(section: Any) -> dict[str, Any]:
    if section is None:
        raise CLIError(
            f"the run file has no model section; give `model: NAME` with NAME one of "
            f"{list(BUILTIN_MODELS)}, a hub id or a local folder, or `model: {{name_or_path: "
            "..., dtype: ..., device: ...}`."
        )
    if isinstance(section, str):
        section = {"name_or_path": section}
    if not isinstance(section, Mapping):
        raise CLIError(f"model must be a name or a mapping, got {section!r}.")
    check_keys(section, MODEL_KEYS, "model key")
    name = section.get("name_or_path")
    if not name:
        raise CLIError(f"model needs name_or_path: one of {list(BUILTIN_MODELS)}, or a path.")
    near = difflib.get_close_matches(str(name), BUILTIN_MODELS, n=1, cutoff=0.75)
    if near and name not in BUILTIN_MODELS and not Path(str(name)).exists():
        raise CLIError(
            f"model {name!r} is no built-in model (did you mean {near[0]!r}?) nor a folder; "
            f"the built-in ones: {list(BUILTIN_MODELS)}."
        )
    unused = [k for k in TINY_UNUSED if k in section] if name == "tiny" else []
    if unused:
        raise CLIError(
            f"model.{unused[0]} is not used by the built-in tiny model (a small random float32 "
            "model built from a config, no file behind it); remove it."
        )
    dtype, device = section.get("dtype"), section.get("device")
    if dtype is not None and str(dtype).removeprefix("torch.") not in DTYPES:
        raise CLIError(f"model.dtype={dtype!r} is not one of {list(DTYPES)}.")
    if device is not None and not _DEVICE.fullmatch(str(device)):
        raise CLIError(
            f"model.device={device!r} is not a device: give 'cpu', 'cuda', 'cuda:N', 'mps' "
            "or 'auto'."
        )
    return dict(section)


def _models(
    name: str, count: int, model_config: Mapping[str, Any], seed: int, *, one_base: bool = False
) -> dict[str, Any]:
    """Trainer arguments for ``count`` models named ``name``: built-in, hub id or folder
    (``one_base``: adapter agents, so ``tiny`` is one model shared by the team)."""
    if name == "tiny":
        from cmlrl_agents.tiny_models import tiny_agent

        keys = ("chat_template", "system_prompt", "device")
        options = {k: model_config[k] for k in keys if k in model_config}
        if one_base:
            return {"agents": [tiny_agent(seed, **options)] * count}
        return {"agents": [tiny_agent(seed + i, **options) for i in range(count)]}
    if name == "smollm2":
        from cmlrl_agents.policies.agent import smollm2_path

        return {"agent_model": str(smollm2_path(model_config.get("cache_dir")))}
    return {"agent_model": name}


def build_trainer(p: Plan, *, use_wandb: bool = True, agent_dirs: Sequence[Path] = ()) -> Any:
    """The trainer of a plan; ``agent_dirs`` (one ``save_model`` folder per agent) replace the
    run file's model."""
    assert p.model is not None, "plan(..., need_model=True) first"
    num_agents = p.config.num_agents or p.task.num_agents or 2
    roles = p.algorithm in SINGLE_POLICY_ALGORITHMS  # the spec is the team task of num_roles
    # A single-policy algorithm's config (CentralizedMAGRPOConfig) has num_roles.
    num_roles = (getattr(p.config, "num_roles", None) or p.task.num_agents) if roles else None
    if roles and num_roles is None:
        raise CLIError(
            f"{p.algorithm} needs the number of roles: give one formatter per role "
            "(task.formatters: [...]) or config.num_roles."
        )
    model_config = {k: v for k, v in p.model.items() if k in MODEL_CONFIG_KEYS}
    name = str(p.model["name_or_path"])
    if agent_dirs:
        models: dict[str, Any] = {"agents": [str(d) for d in agent_dirs]}
    else:
        count = 1 if roles else num_agents
        models = _models(name, count, model_config, seed=0, one_base=p.peft is not None)
    num_critics = _num_critics(p, num_agents)
    if num_critics:
        critic = _models(
            str(p.model.get("critic_name_or_path", name)), num_critics, model_config, seed=100
        )
        models |= {"critic_model": critic.get("agent_model"), "critics": critic.get("agents")}
    return p.trainer_class(
        **models,
        model_config=model_config or None,
        task=p.task.spec(p.config, num_agents=num_roles if roles else num_agents),
        eval_dataset=p.task.eval_dataset,
        wandb_config=p.wandb if use_wandb else None,
        args=p.config,
        **({} if p.peft is None else {"peft_config": p.peft}),
        **p.task.callbacks,
    )


def _num_critics(p: Plan, num_agents: int) -> int:
    if "critic_model" not in TRAINER_TAKES[p.algorithm]:
        return 0
    if p.algorithm == "maac":
        return 1
    return num_agents if getattr(p.config, "use_separate_critic", True) else 0
