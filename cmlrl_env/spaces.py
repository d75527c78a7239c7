"""Text spaces for prompts and completions.

Gymnasium's ``Text`` only contains strings drawn from its charset (alphanumeric by default), so a
real completion with a space, an accent or an emoji would fail ``contains``. ``TextSpace`` keeps
``Text``'s sampling (printable ASCII, readable in random-action tests) but contains any ``str`` of
at most ``max_length`` characters.
"""

from __future__ import annotations

import string
from typing import Any

from gymnasium import spaces

__all__ = ["TextSpace", "DEFAULT_MAX_CHARS"]

DEFAULT_MAX_CHARS = 65_536


class TextSpace(spaces.Text):
    """Any Unicode string of ``min_length`` to ``max_length`` characters (not tokens)."""

    def __init__(
        self, max_length: int = DEFAULT_MAX_CHARS, *, min_length: int = 0, seed: int | None = None
    ) -> None:
        super().__init__(max_length, min_length=min_length, charset=string.printable, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(min_length={self.min_length}, max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, TextSpace)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((TextSpace, self.min_length, self.max_length))
