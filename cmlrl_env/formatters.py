"""Formatters: item → prompt, one per agent (SPEC §3)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cmlrl_env._errors import add_context, describe_callable

__all__ = ["Formatter", "Formatters", "default_formatter"]

Formatter = Callable[..., str]


def default_formatter(item: Mapping[str, Any]) -> str:
    """The task item's ``prompt`` field (SPEC §2)."""
    if "prompt" not in item:
        raise KeyError(
            f"the default formatter reads the 'prompt' field, but the item has only "
            f"{sorted(item)}; add a 'prompt' column or pass formatters=..."
        )
    prompt: str = item["prompt"]  # Formatters refuses a prompt that is not a string
    return prompt


def _accepts_keyword(func: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: assume the plain form
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == name and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in params
    )


class Formatters:
    """One formatter per agent, resolved and checked once.

    ``formatters`` is ``None`` (every agent reads ``item["prompt"]``), one callable shared by all
    agents, or a sequence with one callable per agent in actor order.

    From turn 2 on, the transition's prompt for an agent replaces ``item["prompt"]`` in a copy of
    the item, and the formatter is called on that copy; a formatter that declares
    ``external_prompts`` also receives the transition's prompt under that keyword.
    """

    def __init__(self, formatters: Formatter | Sequence[Formatter] | None, num_agents: int) -> None:
        if formatters is None:
            funcs: list[Formatter] = [default_formatter] * num_agents
        elif callable(formatters):
            funcs = [formatters] * num_agents
        elif isinstance(formatters, Sequence) and not isinstance(formatters, str):
            funcs = list(formatters)
            if len(funcs) != num_agents:
                raise ValueError(
                    f"formatters has {len(funcs)} entries but num_agents={num_agents}; give one "
                    "formatter per agent in actor order, or a single shared callable."
                )
        else:
            raise TypeError(
                f"formatters must be None, a callable, or a list of callables; got "
                f"{type(formatters).__name__}."
            )
        for i, func in enumerate(funcs):
            if not callable(func):
                raise TypeError(
                    f"formatters[{i}] is {func!r}, which is not callable; pass a function "
                    "item -> str."
                )
        self.funcs = funcs
        self._takes_external = [_accepts_keyword(f, "external_prompts") for f in funcs]

    def __len__(self) -> int:
        return len(self.funcs)

    def format(
        self,
        agent: int,
        item: Mapping[str, Any],
        *,
        item_index: int | None = None,
        external_prompt: str | None = None,
    ) -> str:
        """The prompt agent ``agent`` sees for ``item`` (and the transition's prompt, if any)."""
        func = self.funcs[agent]
        kwargs: dict[str, Any] = {}
        if external_prompt is not None:
            item = {**item, "prompt": external_prompt}
            if self._takes_external[agent]:
                kwargs["external_prompts"] = external_prompt
        where = f"item {item_index}" if item_index is not None else "the given item"
        try:
            prompt = func(item, **kwargs)
        except Exception as exc:
            raise add_context(
                exc,
                f"raised by the formatter of agent_{agent} ({describe_callable(func)}) on "
                f"{where}; the item's fields are {sorted(item)}.",
            ) from None
        if not isinstance(prompt, str):
            raise TypeError(
                f"the formatter of agent_{agent} ({describe_callable(func)}) returned "
                f"{type(prompt).__name__} {prompt!r:.80} on {where}; a formatter must return the "
                "prompt as a str."
            )
        return prompt
