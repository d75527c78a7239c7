"""Optimizers for agents, critics and reward models: one AdamW recipe, shared (the step itself
is the engine's: learning/engine.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from cmlrl_agents.foundation.config import SharedConfig

__all__ = ["AdamWOptions", "agent_optimizers", "make_adamw", "refuse_shared_parameters"]


@dataclass(frozen=True)
class AdamWOptions:
    """AdamW's settings besides the rate: Hugging Face's Trainer defaults (``weight_decay`` 0,
    not torch's 0.01, so no decay applies that no setting names)."""

    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    @classmethod
    def of(cls, args: SharedConfig) -> AdamWOptions:
        """The config's ``weight_decay``, ``adam_beta1``, ``adam_beta2`` and ``adam_epsilon``."""
        return cls(
            weight_decay=args.weight_decay,
            betas=(args.adam_beta1, args.adam_beta2),
            eps=args.adam_epsilon,
        )


def make_adamw(
    params: Iterable[torch.nn.Parameter] | list[dict[str, Any]],
    lr: float,
    name: str,
    options: AdamWOptions = AdamWOptions(),
) -> torch.optim.Optimizer:
    """AdamW over ``params`` (tensors or param groups) at ``lr`` with ``options``; ``name``
    appears in errors.

    The fused kernel when every parameter is a float on CPU or CUDA: on 2 CPU cores it steps
    SmolLM2-135M in 0.18 s against 1.5 s for ``foreach`` (and 0.5 s against 8.4 s on the first
    step), and allocates no full-size temporaries, so peak memory stays lower too.
    """
    given: list[Any] = list(params)  # tensors or param groups
    groups: list[dict[str, Any]] = given
    if given and not isinstance(given[0], dict):
        groups = [{"params": given}]
    tensors = [p for group in groups for p in group["params"]]
    if not tensors:
        raise ValueError(
            f"{name} has no trainable parameters (requires_grad=False everywhere); unfreeze "
            "some, or wrap it with a LoRA adapter."
        )
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in tensors)
    return torch.optim.AdamW(
        groups,
        lr=lr,
        weight_decay=options.weight_decay,
        betas=options.betas,
        eps=options.eps,
        fused=fused or None,
    )


def agent_optimizers(agents: Sequence[Any], args: SharedConfig) -> list[torch.optim.Optimizer]:
    """One AdamW per agent over its trainable parameters (an adapter agent's: its adapter), at
    the config's ``agent_learning_rate`` and :class:`AdamWOptions`."""
    options = AdamWOptions.of(args)
    return [
        make_adamw(agent.trainable_parameters(), args.agent_learning_rate, f"agents[{i}]", options)
        for i, agent in enumerate(agents)
    ]


def refuse_shared_parameters(optimizers: Mapping[str, torch.optim.Optimizer]) -> None:
    """Refuse two optimizers that hold one parameter: each would step it with moments of its
    own, so its weights would move twice a round (two agents given one model object, or a
    critic that is an agent's model)."""
    owner: dict[int, str] = {}
    for name, optimizer in optimizers.items():
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                first = owner.setdefault(id(parameter), name)
                if first != name:
                    raise ValueError(
                        f"the optimizers {first} and {name} both train a parameter of shape "
                        f"{list(parameter.shape)}: their models share it, so every round would "
                        "step it twice. Give each agent (and each separate critic) a model of "
                        "its own: agent_model='<name>' loads one copy per agent, copy.deepcopy "
                        "copies a model object, peft_config trains one adapter per agent over "
                        "one shared base, and use_separate_critic=False puts the value head on "
                        "the actor."
                    )
