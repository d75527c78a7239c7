"""The reward contract (SPEC §4), bound once, and reward processors.

``reward_func`` receives one list of completions per agent, positionally, in actor order; if it
accepts ``batch_items`` it also receives the task items (the scored item is ``batch_items[0]``).
It returns one reward per joint response. All three forms work::

    def r(brief, detailed, *, batch_items): ...
    def r(c1, c2): ...
    def r(c1, c2, batch_items=None): ...   # the form the reference silently breaks (bug B4)

The signature is read once, when the env is built; a ``TypeError`` raised by the function itself
propagates unchanged (never retried with other arguments).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cmlrl_env._errors import add_context, describe_callable

__all__ = ["RewardFunction", "RewardProcessors", "RewardProcessor"]

RewardProcessor = Callable[[float], float]


def _example_signature(num_agents: int) -> str:
    """A reward signature for ``num_agents`` agents, short enough to read for any team size."""
    if num_agents > 4:
        return "def reward_func(*completions, batch_items=None)"
    params = ", ".join(f"c{i + 1}" for i in range(num_agents))
    return f"def reward_func({params}, *, batch_items=None)"


class RewardFunction:
    """A user reward function bound to ``num_agents`` by its signature."""

    def __init__(self, func: Callable[..., Any], num_agents: int) -> None:
        if not callable(func):
            raise TypeError(f"reward_func must be callable, got {func!r}.")
        self.func = func
        self.num_agents = num_agents
        self.name = describe_callable(func)
        self.passes_items = self._bind(func, num_agents)

    def _bind(self, func: Callable[..., Any], num_agents: int) -> bool:
        try:
            params = list(inspect.signature(func).parameters.values())
        except (TypeError, ValueError):
            return False  # no introspectable signature: call with the completion lists only
        positional = [
            p
            for p in params
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "batch_items"
        ]
        required = [p for p in positional if p.default is p.empty]
        has_varargs = any(p.kind is p.VAR_POSITIONAL for p in params)
        if len(required) > num_agents or (not has_varargs and len(positional) < num_agents):
            names = ", ".join(p.name for p in positional[:8]) or "none"
            if len(positional) > 8:
                names += ", ..."
            raise TypeError(
                f"reward_func {self.name} takes {len(positional)} positional completion "
                f"parameter(s) ({names}) but the env has {num_agents} agent(s); it must accept one "
                f"list of completions per agent, e.g. {_example_signature(num_agents)}."
            )
        extra = [
            p.name
            for p in params
            if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name != "batch_items"
        ]
        if extra:
            raise TypeError(
                f"reward_func {self.name} requires keyword argument(s) {extra} that the env never "
                "passes; it passes only batch_items. Give them defaults or remove them."
            )
        return any(
            p.kind is p.VAR_KEYWORD or (p.name == "batch_items" and p.kind is not p.POSITIONAL_ONLY)
            for p in params
        )

    def __call__(
        self,
        completions: Sequence[Sequence[str]],
        item: Mapping[str, Any],
        *,
        item_index: int | None = None,
    ) -> list[float]:
        """Score ``len(completions[0])`` joint responses for one item with one call."""
        expected = len(completions[0])
        lists = [list(c) for c in completions]
        kwargs = {"batch_items": [item]} if self.passes_items else {}
        where = f"item {item_index}" if item_index is not None else "the given item"
        try:
            result = self.func(*lists, **kwargs)
        except Exception as exc:
            raise add_context(
                exc,
                f"raised by reward_func {self.name} while scoring {expected} joint "
                f"response(s) of {where}.",
            ) from None
        return self._validate(result, expected, where)

    def _validate(self, result: Any, expected: int, where: str) -> list[float]:
        if hasattr(result, "tolist") and not isinstance(result, (str, bytes)):
            result = result.tolist()  # numpy arrays and torch tensors
        if not isinstance(result, Sequence) or isinstance(result, (str, bytes)):
            raise TypeError(
                f"reward_func {self.name} returned {type(result).__name__} {result!r:.80} for "
                f"{where}; it must return a list with one float per joint response ({expected})."
            )
        if len(result) != expected:
            raise ValueError(
                f"reward_func {self.name} returned {len(result)} reward(s) for {where} but was "
                f"given {expected} joint response(s); return exactly one reward per joint response."
            )
        rewards = []
        for j, value in enumerate(result):
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(
                    f"reward_func {self.name} returned {value!r:.80} ({type(value).__name__}) at "
                    f"position {j} for {where}; every reward must be a real number."
                )
            try:
                number = float(value)
            except (OverflowError, ValueError) as exc:  # 10**400, an exotic Real subclass
                raise ValueError(
                    f"reward_func {self.name} returned {value!r:.80} at position {j} for "
                    f"{where}, which is not convertible to a float ({exc}); return finite "
                    "floats."
                ) from None
            if not math.isfinite(number):
                raise ValueError(
                    f"reward_func {self.name} returned {value} at position {j} for {where}; "
                    "rewards must be finite (no NaN or inf)."
                )
            rewards.append(number)
        return rewards


def apply_processor(processor: RewardProcessor, rewards: list[float], name: str) -> list[float]:
    processed = []
    for j, value in enumerate(rewards):
        out = processor(value)
        number = _finite_float(out)
        if number is None:
            raise ValueError(
                f"reward_processor {name} turned reward {value} into {out!r:.80}; it must "
                f"return a finite real number (reward at position {j})."
            )
        processed.append(number)
    return processed


def _finite_float(value: object) -> float | None:
    """``value`` as a finite float, or None when it is not a real number or does not fit."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


class _Processor:
    """A named, picklable float → float transform (repr shows what it does)."""

    def __init__(self, name: str, func: Callable[[float], float]) -> None:
        self.name = name
        self.func = func

    def __call__(self, reward: float) -> float:
        return self.func(reward)

    def __repr__(self) -> str:
        return self.name


class RewardProcessors:
    """Reward transforms applied after ``reward_func`` and before training (SPEC §4)."""

    @staticmethod
    def identity() -> RewardProcessor:
        return _Processor("identity()", lambda r: r)

    @staticmethod
    def scale(factor: float = 1.0) -> RewardProcessor:
        """``r * factor`` (default 1.0: unchanged, as in the reference)."""
        _check_real("factor", factor)
        return _Processor(f"scale(factor={factor})", lambda r: r * factor)

    @staticmethod
    def shift(value: float = 0.0) -> RewardProcessor:
        """``r + value`` (default 0.0: unchanged, as in the reference)."""
        _check_real("value", value)
        return _Processor(f"shift(value={value})", lambda r: r + value)

    @staticmethod
    def clip(low: float = -math.inf, high: float = math.inf) -> RewardProcessor:
        """``min(max(r, low), high)``; an infinite bound is no bound."""
        for bound, value in (("low", low), ("high", high)):
            if _finite_float(value) is None and value not in (math.inf, -math.inf):
                raise ValueError(
                    f"clip's {bound} must be a real number (math.inf for no bound), got "
                    f"{value!r:.80}."
                )
        if low > high:
            raise ValueError(f"clip needs low <= high, got low={low}, high={high}.")
        return _Processor(f"clip(low={low}, high={high})", lambda r: min(max(r, low), high))

    @staticmethod
    def compose(*processors: RewardProcessor) -> RewardProcessor:
        """Apply ``processors`` left to right: ``compose(scale(2), shift(1))(r) == 2 * r + 1``."""
        for i, p in enumerate(processors):
            if not callable(p):
                raise TypeError(f"compose argument {i} is {p!r}, which is not callable.")

        def run(reward: float) -> float:
            for p in processors:
                reward = p(reward)
            return reward

        return _Processor("compose(" + ", ".join(map(repr, processors)) + ")", run)


def _check_real(name: str, value: object) -> None:
    if _finite_float(value) is None:
        raise ValueError(f"{name} must be a finite real number, got {value!r:.80}.")
