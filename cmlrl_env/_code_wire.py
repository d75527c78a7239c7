"""Plain values across the pipe between the trusted checker and the sandboxed program.

Both sides use this file (stdlib only): the checker loads it, and its text is part of every
program the sandbox runs. A value travels as JSON in which every container is a list whose
first item names its type, so a tuple stays a tuple and a dict may have keys that are not
strings. Only plain built-in values pass: None, bool, int, float, complex, str, bytes, tuple,
list, dict, set and frozenset. A subclass of one (a Counter, a namedtuple, an IntEnum) travels
as its base type's value, so its own ``__eq__`` stays behind; an iterator or a range travels as
its items and arrives as an iterator over them (it compares like the program's iterator did, and
``tuple()`` of it gives the items); anything else is refused with the reason.

Whatever the program sends, ``decode`` builds plain built-in values and nothing else: no object
of the program's making reaches the checker's comparisons.
"""

# The program's text starts with this file's, so no ``from __future__`` (the solution, compiled
# inside the program, would inherit it) and no ``typing`` import: the annotations that name
# ``collections.abc`` are strings, read by type checkers only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

MAX_DEPTH = 100
MAX_ITEMS = 100_000
_EXACT_INT = 2**53


class NotPlain(ValueError):
    """A value that is not plain data (or too deep, or too long) to send across."""


def _items(value: "Iterable[object]", depth: int) -> list[object]:
    return [encode(v, depth + 1) for v in value]


def _iterated(value: "Iterable[object]", depth: int) -> list[object]:
    items: list[object] = []
    for item in value:
        if len(items) == MAX_ITEMS:
            raise NotPlain(f"an iterator longer than {MAX_ITEMS} items")
        items.append(encode(item, depth + 1))
    return ["i", *items]


def _number(value: int | float | complex) -> object:
    if isinstance(value, int):
        value = int.__int__(value)
        return value if -_EXACT_INT < value < _EXACT_INT else ["n", format(value, "x")]
    if isinstance(value, float):
        return float.__float__(value)
    return ["c", complex.real.__get__(value), complex.imag.__get__(value)]


def encode(value: object, depth: int = 0) -> object:
    """``value`` as JSON-ready data; ``NotPlain`` for anything that is not plain data."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"a value nested deeper than {MAX_DEPTH} levels")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, (int, float, complex)):
        return _number(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return ["b", bytes.hex(bytes(value))]
    for kind, tag in ((tuple, "t"), (list, "l"), (frozenset, "f"), (set, "s")):
        if isinstance(value, kind):
            return [tag, *_items(value, depth)]
    if isinstance(value, dict):
        pairs = dict.items(value)
        return ["d", *(x for k, v in pairs for x in (encode(k, depth + 1), encode(v, depth + 1)))]
    if isinstance(value, range) or hasattr(type(value), "__next__"):
        # An iterator (its type has ``__next__``), which hasattr does not tell the checker.
        return _iterated(value, depth)  # type: ignore[arg-type]
    raise NotPlain(f"a {type(value).__name__} is not plain data")


_BUILD: "dict[str, Callable[[Iterable[object]], object]]" = {
    "t": tuple,
    "l": list,
    "s": set,
    "f": frozenset,
    "i": lambda items: iter(list(items)),
}


def decode(data: object, depth: int = 0) -> object:
    """The plain value ``encode`` made; ``ValueError`` for anything it cannot have made."""
    if depth > MAX_DEPTH:
        raise ValueError(f"a value nested deeper than {MAX_DEPTH} levels")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is not list or not data or type(data[0]) is not str:
        raise ValueError(f"not an encoded value: {type(data).__name__}")
    tag, rest = data[0], data[1:]
    if tag == "n" and len(rest) == 1 and type(rest[0]) is str:
        return int(rest[0], 16)
    if tag == "c" and len(rest) == 2 and all(type(x) in (int, float) for x in rest):
        return complex(rest[0], rest[1])
    if tag == "b" and len(rest) == 1 and type(rest[0]) is str:
        return bytes.fromhex(rest[0])
    if tag == "d" and len(rest) % 2 == 0:
        values = [decode(x, depth + 1) for x in rest]
        return dict(zip(values[::2], values[1::2], strict=True))
    if tag in _BUILD:
        return _BUILD[tag](decode(x, depth + 1) for x in rest)
    raise ValueError(f"not an encoded value: tag {tag!r}")
