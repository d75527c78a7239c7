"""External transitions: a joint response → the next prompt of each agent (SPEC §6)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cmlrl_env._errors import add_context, describe_callable

__all__ = ["Transition", "HISTORY_KEYWORDS", "ITEM_KEYWORD"]

HISTORY_KEYWORDS = ("prompt_history_per_agent", "response_history_per_agent")
ITEM_KEYWORD = "item"
_REQUIRED = ("prompt", "agent_completions", "num_agents")


class Transition:
    """``external_transition(prompt, agent_completions, num_agents, **history)`` bound once.

    Called with keyword arguments: ``prompt`` (the item's ``prompt`` field),
    ``agent_completions`` (this turn's completion of each agent), ``num_agents``, and the history
    along the branch, ``prompt_history_per_agent[agent][turn]`` and
    ``response_history_per_agent[agent][turn]`` (both include the turn just played), when the
    function accepts them (by name or ``**kwargs``), and ``item``, the whole task item, when the
    function names it (not through ``**kwargs``, which comlrl's transitions take for the history
    alone): a task whose items carry more than a prompt (a code problem's tests) finds it there.
    It returns one prompt per agent.

    Each returned prompt then goes through that agent's formatter, as a task item's prompt does
    at turn 1: it replaces ``item["prompt"]`` in a copy of the item (``Formatters.format``). A
    formatter that wraps ``item["prompt"]`` in an instruction therefore wraps it too; one that
    takes ``external_prompts`` can return the transition's prompt unchanged.
    """

    def __init__(self, func: Callable[..., Any], num_agents: int) -> None:
        if not callable(func):
            raise TypeError(f"external_transition must be callable, got {func!r}.")
        self.func = func
        self.num_agents = num_agents
        self.name = describe_callable(func)
        params = inspect.signature(func).parameters
        var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        missing = [n for n in _REQUIRED if n not in params and not var_kw]
        if missing:
            raise TypeError(
                f"external_transition {self.name} does not accept {missing}; it is called as "
                "f(prompt=..., agent_completions=..., num_agents=..., **history), e.g. "
                "def transition(prompt, agent_completions, num_agents, **history)."
            )
        self.history_keywords = tuple(k for k in HISTORY_KEYWORDS if var_kw or k in params)
        self.takes_item = ITEM_KEYWORD in params and params[ITEM_KEYWORD].kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )

    def __call__(
        self,
        item: Mapping[str, Any],
        joint_action: Sequence[str],
        *,
        prompt_history: Sequence[Sequence[str]],
        response_history: Sequence[Sequence[str]],
        item_index: int | None = None,
    ) -> list[str]:
        where = f"item {item_index}" if item_index is not None else "the given item"
        if "prompt" not in item:
            raise KeyError(
                f"external_transition receives prompt=item['prompt'], but {where} has only "
                f"{sorted(item)}; add a 'prompt' field to the task items."
            )
        history = {
            "prompt_history_per_agent": [list(h) for h in prompt_history],
            "response_history_per_agent": [list(h) for h in response_history],
        }
        kwargs: dict[str, Any] = {k: history[k] for k in self.history_keywords}
        if self.takes_item:
            kwargs[ITEM_KEYWORD] = item
        try:
            prompts = self.func(
                prompt=item["prompt"],
                agent_completions=list(joint_action),
                num_agents=self.num_agents,
                **kwargs,
            )
        except Exception as exc:
            raise add_context(
                exc, f"raised by external_transition {self.name} on {where}."
            ) from None
        if not isinstance(prompts, (list, tuple)) or len(prompts) != self.num_agents:
            got = len(prompts) if isinstance(prompts, (list, tuple)) else type(prompts).__name__
            raise ValueError(
                f"external_transition {self.name} returned {got} prompt(s) for {where}; it must "
                f"return a list of {self.num_agents} strings, one per agent."
            )
        for i, p in enumerate(prompts):
            if not isinstance(p, str):
                raise TypeError(
                    f"external_transition {self.name} returned {type(p).__name__} for agent_{i} "
                    f"on {where}; each prompt must be a str."
                )
        return list(prompts)
