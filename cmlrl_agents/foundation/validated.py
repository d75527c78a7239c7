"""``ValidatedConfig``: the mixin that makes a config dataclass check itself, with one rule
helper per kind of field (each raising with the field's name and value)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import fields
from typing import Any, ClassVar, Self

from cmlrl_agents.foundation.config_names import unknown_field_message

__all__ = ["ValidatedConfig"]


class ValidatedConfig:
    """Mixin: ``validate()`` runs after ``__init__`` and on each assignment (undone on error).

    A trainer marks the fields it reads only once, at construction, with :meth:`fix_fields`;
    assigning a new value to one then raises instead of passing validation and doing nothing.
    """

    _ready = False
    _fixed: dict[str, str] = {}  # noqa: RUF012 - replaced per instance by fix_fields
    # Set by @dataclass on every config class; declared so that type checkers take the mixin
    # for a dataclass (``fields``, ``asdict``).
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # Before the dataclass __init__, whose TypeError would not say what to write instead.
        names = {f.name for f in fields(cls)}
        for name in kwargs:
            if name not in names:
                raise TypeError(unknown_field_message(cls, name))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        self.validate()
        object.__setattr__(self, "_ready", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if not self._ready:
            object.__setattr__(self, name, value)
            return
        if name not in {f.name for f in fields(self)}:
            raise AttributeError(unknown_field_message(type(self), name))
        old = getattr(self, name)
        if name in self._fixed and value != old:
            raise AttributeError(
                f"args.{name} cannot change after {self._fixed[name]} was built (it is used "
                f"once, at construction, with {name}={old!r}); build a new trainer with "
                f"{type(self).__name__}(..., {name}={value!r})."
            )
        object.__setattr__(self, name, value)
        try:
            self.validate()
        except (TypeError, ValueError):
            object.__setattr__(self, name, old)
            raise

    def validate(self) -> None:
        raise NotImplementedError

    def fix_fields(self, names: tuple[str, ...], owner: str) -> None:
        """Refuse later changes to ``names``: ``owner`` (a trainer) read them once."""
        fixed = {**self._fixed, **dict.fromkeys(names, owner)}
        object.__setattr__(self, "_fixed", fixed)

    def __getstate__(self) -> dict[str, Any]:
        # A copy (copy.deepcopy, pickle) is a new config for a new trainer: nothing fixed yet.
        state = dict(self.__dict__)
        state.pop("_fixed", None)
        return state

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    # -- rule helpers: each raises with the field name and value ---------------------------------
    def _int(self, name: str, low: int | None = None, *, optional: bool = False) -> None:
        value = getattr(self, name)
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__}).")
        if low is not None and value < low:
            raise ValueError(f"{name} must be >= {low}, got {value}.")

    def _real(
        self,
        name: str,
        low: float | None = None,
        high: float | None = None,
        *,
        low_open: bool = False,
        optional: bool = False,
    ) -> None:
        value = getattr(self, name)
        if optional and value is None:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise TypeError(f"{name} must be a number, got {value!r}.")
        if math.isinf(value):
            # An infinite rate, temperature or coefficient turns every update into NaN.
            hint = " (None turns it off)" if optional else ""
            raise ValueError(f"{name} must be finite, got {value}{hint}.")
        if low is not None and (value <= low if low_open else value < low):
            op = ">" if low_open else ">="
            raise ValueError(f"{name} must be {op} {low}, got {value}.")
        if high is not None and value > high:
            raise ValueError(f"{name} must be <= {high}, got {value}.")

    def _choice(self, name: str, choices: tuple[str, ...]) -> None:
        value = getattr(self, name)
        if value not in choices:
            raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")

    def _devices(self, name: str) -> None:
        """None, one device string (or "auto") for every model, or a list of device strings."""
        value = getattr(self, name)
        if value is None or value == "auto":
            return
        from torch import device as torch_device  # here: `cmlrl check` builds configs sans torch

        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise TypeError(
                f"{name} must be a device string ('cpu', 'cuda:0', 'auto') or a non-empty list "
                f"of them (one per model, or one for all), got {value!r}."
            )
        for item in items:
            if not isinstance(item, str):
                raise TypeError(f"{name} entries must be device strings, got {item!r}.")
            try:
                torch_device(item)
            except (RuntimeError, ValueError):
                raise ValueError(
                    f"{name} has {item!r}, which is not a device; use e.g. 'cpu', 'cuda:0' or "
                    "'mps' ('auto' only as the whole value)."
                ) from None

    def _bool(self, name: str) -> None:
        value = getattr(self, name)
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, got {value!r}.")
