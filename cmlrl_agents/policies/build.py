"""Building the team of LLM agents from the trainer's constructor arguments (SPEC §5).

``agent_model="Qwen/Qwen2.5-0.5B"`` (a hub id or a local folder) loads one independent copy per
agent; ``agents=[model_a, model_b]`` with ``tokenizer=`` uses given models; ``LLMAgent`` objects
are used as they are. ``peft_config=LoraConfig(...)`` makes each agent a LoRA adapter (one base
per distinct model, loaded once from ``agent_model``; see :mod:`cmlrl_agents.policies.adapters`).
The team size comes from whichever of ``num_agents=``, ``args.num_agents``, ``agents`` and the
formatters list is given, and they must agree (the reference silently ignores
``args.num_agents``, bug B18).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from cmlrl_agents.policies.adapters import attach_adapters, check_peft_config, same_device
from cmlrl_agents.policies.agent import LLMAgent
from cmlrl_agents.policies.model_keys import MODEL_CONFIG_KEYS

__all__ = ["MODEL_CONFIG_KEYS", "resolve_num_agents", "build_agents"]


def resolve_num_agents(**sources: int | None) -> int:
    """The one team size all given sources agree on (2 when none is given)."""
    given = {name: n for name, n in sources.items() if n is not None}
    if len(set(given.values())) > 1:
        detail = ", ".join(f"{name}={n}" for name, n in given.items())
        raise ValueError(
            f"the team size is given inconsistently ({detail}); make them equal "
            "(e.g. MAGRPOConfig(num_agents=N) with N agents and N formatters)."
        )
    return next(iter(given.values()), 2)


def _check_model_config(model_config: Mapping[str, Any] | None) -> dict[str, Any]:
    config = dict(model_config or {})
    unknown = sorted(set(config) - set(MODEL_CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"model_config has unknown key(s) {unknown}; valid keys: {list(MODEL_CONFIG_KEYS)}."
        )
    if "torch_dtype" in config:
        if "dtype" in config:
            raise ValueError("model_config gives both dtype and torch_dtype; keep one.")
        config["dtype"] = config.pop("torch_dtype")
    return config


def _tokenizer_for(tokenizer: Any, index: int, num_agents: int) -> Any:
    if isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != num_agents:
            raise ValueError(
                f"tokenizer is a list of {len(tokenizer)} but there are {num_agents} "
                "agents; give one tokenizer, or one per agent."
            )
        return tokenizer[index]
    return tokenizer


def build_agents(
    *,
    agent_model: Any = None,
    agents: Sequence[Any] | None = None,
    tokenizer: Any = None,
    num_agents: int,
    model_config: Mapping[str, Any] | None = None,
    devices: Sequence[torch.device] | None = None,
    devices_field: str = "agent_devices",
    peft_config: Any = None,
) -> list[LLMAgent]:
    """One ``LLMAgent`` per agent from ``agent_model`` (a str) or ``agents`` (models or agents),
    model i on ``devices[i]`` when given; with ``peft_config`` each agent is a LoRA adapter and
    ``agent_model`` is loaded ONCE as their base (see :mod:`cmlrl_agents.policies.adapters`)."""
    config = _check_model_config(model_config)
    configs = check_peft_config(peft_config, num_agents)
    if devices is not None and config.get("device") is not None:
        raise ValueError(
            f"model_config['device']={config['device']!r} and args.{devices_field} both place "
            f"the models; keep one (args.{devices_field} can also give one device per model)."
        )
    specs = _model_specs(agent_model, agents, num_agents)
    if configs is not None and agent_model is not None:  # one base for the whole team
        one = _build_one(
            agent_model,
            _tokenizer_for(tokenizer, 0, num_agents),
            config,
            0,
            None if devices is None else devices[0],
        )
        team = attach_adapters([one] * num_agents, configs)
        same_device(team, devices)
        return team
    built = [
        _build_one(
            spec,
            _tokenizer_for(tokenizer, i, len(specs)),
            config,
            i,
            None if devices is None else devices[i],
        )
        for i, spec in enumerate(specs)
    ]
    if configs is None:
        return built
    team = attach_adapters(built, configs)
    same_device(team, devices)
    return team


def _model_specs(agent_model: Any, agents: Sequence[Any] | None, num_agents: int) -> list[Any]:
    """What each agent is built from: ``agent_model`` (a str) for all, or one of ``agents``."""
    if agent_model is not None and agents is not None:
        raise ValueError(
            "pass agent_model (one model name for every agent) or agents (one per agent), not both."
        )
    if agent_model is None and agents is None:
        raise ValueError(
            "no model given: pass agent_model='<hub id or local folder>' or "
            "agents=[model, ...] with tokenizer=..."
        )
    if agents is not None:
        return list(agents)
    if isinstance(agent_model, LLMAgent) or not isinstance(agent_model, str):
        raise TypeError(
            f"agent_model must be a hub id or local folder (str), got "
            f"{type(agent_model).__name__}; pass model objects as agents=[...]."
        )
    return [agent_model] * num_agents


def _build_one(
    spec: Any, tokenizer: Any, config: dict[str, Any], index: int, device: Any
) -> LLMAgent:
    if isinstance(spec, LLMAgent):
        if device is not None:
            spec.model.to(device)  # in place: the agent keeps its model object
        return spec
    device = config.get("device") if device is None else device
    if isinstance(spec, str):
        model_kwargs = dict(config.get("model_kwargs") or {})
        if device is not None and torch.device(device).type != "cpu":
            # Loaded straight onto the device, never materialised on the CPU first.
            model_kwargs.setdefault("device_map", {"": str(device)})
            device = None
        return LLMAgent.from_pretrained(
            spec,
            tokenizer=tokenizer,
            gguf_file=config.get("gguf_file"),
            dtype=config.get("dtype"),
            device=device,
            chat_template=config.get("chat_template"),
            system_prompt=config.get("system_prompt"),
            model_kwargs=model_kwargs or None,
            cache_dir=config.get("cache_dir"),
        )
    if tokenizer is None:
        raise ValueError(
            f"agents[{index}] is a model object, which needs a tokenizer: pass "
            "tokenizer=... (one shared, or a list with one per agent)."
        )
    return LLMAgent(
        spec,
        tokenizer,
        chat_template=config.get("chat_template"),
        system_prompt=config.get("system_prompt"),
        device=device,
    )
