"""Text spaces for prompts and completions, and the Gymnasium utilities that work on them.

Gymnasium's ``Text`` only contains strings drawn from its charset (alphanumeric by default), so a
real completion with a space, an accent or an emoji would fail ``contains``. ``TextSpace`` keeps
``Text``'s sampling (printable ASCII, readable in random-action tests) but contains any ``str`` of
at most ``max_length`` characters.

Every Gymnasium space utility works on everything ``contains`` accepts, because this module
registers ``TextSpace`` versions of them (``functools.singledispatch`` picks the most specific
class, so these replace ``Text``'s charset-index versions, which raise ``KeyError`` on ``'é'``):

- ``gymnasium.spaces.flatten`` / ``unflatten`` / ``flatten_space`` / ``flatdim``: a string
  flattens to its **UTF-8 bytes** in a ``uint8`` vector of ``4 * max_length`` bytes (the most a
  string of ``max_length`` code points can take), padded with ``0xFF``, a byte UTF-8 never uses.
  ``max_length`` stays a count of characters; lone surrogates round-trip too (``surrogatepass``).
- ``gymnasium.vector.utils``: ``batch_space`` gives a ``TextBatch``; ``iterate``, ``concatenate``
  and ``create_empty_array`` treat a batch of text as a tuple of ``str``; the shared-memory
  functions store the flattened bytes, so ``AsyncVectorEnv(shared_memory=True)`` works.
  SuperSuit's vector envs use exactly these.
"""

from __future__ import annotations

import copy
import multiprocessing as mp
import string
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Sequence as CollectionsSequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np
from gymnasium import spaces
from gymnasium.spaces import utils as space_utils
from gymnasium.vector import utils as vector_utils

__all__ = [
    "BYTES_PER_CHAR",
    "DEFAULT_MAX_CHARS",
    "SharedTextView",
    "TextBatch",
    "TextSpace",
    "decode_text",
    "encode_text",
]

DEFAULT_MAX_CHARS = 65_536
BYTES_PER_CHAR = 4  # UTF-8 encodes any code point in at most 4 bytes
_PAD = 0xFF  # never a byte of UTF-8 (nor of surrogatepass output)


# Gymnasium's ``Text`` builds a set, a tuple, an index dict of NumPy ints and a sorted string of
# its charset in every instance: about 15 KB for the 100 printable characters, so 30 KB per agent
# of an env (two spaces each). Every ``TextSpace`` has the same charset, so they share one copy
# (``Text`` only reads these tables); each keeps its own bounds and sampling generator.
_PRINTABLE_TABLES = {
    name: value
    for name, value in vars(spaces.Text(1, min_length=0, charset=string.printable)).items()
    if name.startswith("_char")
}


class TextSpace(spaces.Text):
    """Any Unicode string of ``min_length`` to ``max_length`` characters (not tokens)."""

    def __init__(
        self, max_length: int = DEFAULT_MAX_CHARS, *, min_length: int = 0, seed: int | None = None
    ) -> None:
        # Checked here: Gymnasium before 1.4 only asserts the bounds (nothing under python -O).
        for name, value in (("max_length", max_length), ("min_length", min_length)):
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise TypeError(
                    f"TextSpace {name} must be an int (a count of characters), got {value!r} "
                    f"({type(value).__name__})."
                )
        if not 0 <= min_length <= max_length:
            raise ValueError(
                f"TextSpace needs 0 <= min_length <= max_length, got min_length={min_length} "
                f"and max_length={max_length}: give a max_length of at least {max(min_length, 0)}."
            )
        # A one-character charset keeps Text's own check of the seed, at no cost.
        super().__init__(max_length, min_length=min_length, charset="x", seed=seed)
        self.__dict__.update(_PRINTABLE_TABLES)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    @property
    def flat_bytes(self) -> int:
        """Length of the flattened vector: ``4 * max_length`` UTF-8 bytes."""
        return BYTES_PER_CHAR * self.max_length

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


# -- flattening: UTF-8 bytes ----------------------------------------------------------------------
def encode_text(space: TextSpace, x: str) -> np.ndarray:
    """``x`` as UTF-8 bytes padded with ``0xFF`` to ``space.flat_bytes`` (``uint8``)."""
    if not space.contains(x):
        raise ValueError(
            f"cannot flatten {x!r:.80} ({type(x).__name__}): it is not in {space}; give a str of "
            f"{space.min_length} to {space.max_length} characters."
        )
    data = np.frombuffer(x.encode("utf-8", errors="surrogatepass"), dtype=np.uint8)
    out = np.full(space.flat_bytes, _PAD, dtype=np.uint8)
    out[: data.size] = data
    return out


def decode_text(space: TextSpace, x: np.ndarray) -> str:
    """The inverse of ``encode_text``: bytes up to the first ``0xFF``, decoded as UTF-8."""
    data = np.asarray(x, dtype=np.uint8).reshape(-1)
    if data.size != space.flat_bytes:
        raise ValueError(
            f"cannot unflatten {data.size} bytes into {space}: it flattens to "
            f"{space.flat_bytes} bytes (4 per character)."
        )
    ends = np.flatnonzero(data == _PAD)
    end = int(ends[0]) if ends.size else data.size
    return data[:end].tobytes().decode("utf-8", errors="surrogatepass")


@space_utils.flatdim.register(TextSpace)
def _flatdim(space: TextSpace) -> int:
    return space.flat_bytes


# mypy checks a registered class against the fallback's first argument and cannot match a
# subclass of ``Text`` (a ``Space[str]``) against Gymnasium's generic ``Space[T]``, nor a space
# against ``batch_differing_spaces``' sequence of spaces (dispatched on its first item): the
# ignores on the ``def`` lines below are for that.
@space_utils.flatten.register(TextSpace)
def _flatten(space: TextSpace, x: str) -> np.ndarray:  # type: ignore[misc]
    return encode_text(space, x)


@space_utils.unflatten.register(TextSpace)
def _unflatten(space: TextSpace, x: np.ndarray) -> str:  # type: ignore[misc]
    return decode_text(space, x)


@space_utils.flatten_space.register(TextSpace)
def _flatten_space(space: TextSpace) -> spaces.Box:
    return spaces.Box(low=0, high=255, shape=(space.flat_bytes,), dtype=np.uint8)


# Dict/Tuple flattening asks this (private in Gymnasium >= 1.1) for the dtype of each part.
if hasattr(space_utils, "_flat_dtype"):
    space_utils._flat_dtype.register(TextSpace)(lambda space: np.dtype(np.uint8))


# -- vector utilities: a batch of text is a tuple of str ------------------------------------------
# Gymnasium's ``Tuple`` is generic in its element type only from 1.4 on: before, ``Tuple[str]``
# raises "Tuple is not a generic class" (RLlib pins 1.2.2). The parameter is for the type checker
# only (it checks against the locked 1.4); at run time a subclass of ``Tuple[str]`` is one of
# ``Tuple`` anyway.
if TYPE_CHECKING:
    _TupleOfStr = spaces.Tuple[str]
else:
    _TupleOfStr = spaces.Tuple


class TextBatch(_TupleOfStr):
    """``batch_space(TextSpace, n)``: one ``TextSpace`` per vector env; values are tuples of str.

    A plain ``Tuple`` of ``TextSpace`` would not do: once ``TextSpace`` has an ``iterate``,
    Gymnasium iterates such a ``Tuple`` member by member instead of env by env.
    """


@vector_utils.batch_space.register(TextSpace)
def _batch_space(space: TextSpace, n: int = 1) -> TextBatch:
    batch = TextBatch(tuple(copy.deepcopy(space) for _ in range(n)))
    batch.seed(list(map(int, copy.deepcopy(space.np_random).integers(0, 10**8, n))))
    return batch


@vector_utils.batch_differing_spaces.register(TextSpace)
def _batch_differing_spaces(batch: Sequence[TextSpace]) -> TextBatch:  # type: ignore[misc]
    return TextBatch(tuple(copy.deepcopy(space) for space in batch))


# SuperSuit's vector envs iterate the single-env space over a batch; Gymnasium's iterate the
# batched one. Both mean "one str per env".
@vector_utils.iterate.register(TextSpace)
@vector_utils.iterate.register(TextBatch)
def _iterate(space: TextSpace | TextBatch, items: Iterable[str]) -> Iterator[str]:  # type: ignore[misc]
    if isinstance(items, str):  # iterating a str would hand out its characters
        raise TypeError(
            f"a batch of text is a tuple or list of str, one per env, got the str {items!r:.80}."
        )
    return iter(items)


@vector_utils.concatenate.register(TextSpace)
def _concatenate(space: TextSpace, items: Iterable[str], out: Any) -> tuple[str, ...]:
    return tuple(items)


@vector_utils.create_empty_array.register(TextSpace)
def _create_empty_array(
    space: TextSpace, n: int = 1, fn: Callable[..., Any] = np.zeros
) -> tuple[str, ...]:
    return ("x" * space.min_length,) * n


@vector_utils.create_shared_memory.register(TextSpace)
def _create_shared_memory(space: TextSpace, n: int = 1, ctx: ModuleType = mp) -> Any:
    return ctx.Array(np.dtype(np.uint8).char, n * space.flat_bytes)


class SharedTextView(CollectionsSequence[str]):
    """The str of each env, decoded from shared memory when read (``AsyncVectorEnv``).

    ``AsyncVectorEnv`` reads its shared memory once, at construction, and expects a view that
    follows later writes (as a NumPy array does); a tuple of str would stay frozen. ``deepcopy``
    (what ``AsyncVectorEnv(copy=True)`` returns) gives a plain tuple of str.
    """

    def __init__(self, space: TextSpace, data: np.ndarray) -> None:
        self._space = space
        self._data = data

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(decode_text(self._space, row) for row in self._data[index])
        return decode_text(self._space, self._data[index])

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CollectionsSequence) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # a view of mutable memory

    def __repr__(self) -> str:
        return f"SharedTextView({tuple(self)!r})"


@vector_utils.read_from_shared_memory.register(TextSpace)
def _read_from_shared_memory(space: TextSpace, shared_memory: Any, n: int = 1) -> SharedTextView:
    data = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8).reshape(n, space.flat_bytes)
    return SharedTextView(space, data)


@vector_utils.write_to_shared_memory.register(TextSpace)
def _write_to_shared_memory(space: TextSpace, index: int, value: str, shared_memory: Any) -> None:
    size = space.flat_bytes
    destination = np.frombuffer(shared_memory.get_obj(), dtype=np.uint8)
    np.copyto(destination[index * size : (index + 1) * size], encode_text(space, value))
