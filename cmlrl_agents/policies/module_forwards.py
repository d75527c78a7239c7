"""A module's forward replaced for one block: the mechanism of the CPU decoding layout and of
the gathered weight gradients.

``nn.Module.__call__`` calls ``self.forward``, so an instance attribute named ``forward`` takes
the class's place, and deleting it gives the class's back. ``accelerate``'s hooks set such an
attribute too: a module that already has one is not ours to wrap or remove (:func:`own_forward`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

__all__ = ["own_forward", "replaced_forwards"]


def own_forward(module: nn.Module) -> bool:
    """Whether ``module`` has a forward of its own (an instance attribute, as set by
    ``accelerate``'s hooks or by :func:`replaced_forwards`)."""
    return "forward" in vars(module)


@contextmanager
def replaced_forwards(forwards: Iterable[tuple[nn.Module, Callable[..., Any]]]) -> Iterator[None]:
    """Within the block, each module of ``forwards`` runs the forward paired with it (taken
    from the iterable on entry); on leaving, also on error, its class's forward again."""
    replaced: list[nn.Module] = []
    try:
        for module, forward in forwards:
            vars(module)["forward"] = forward
            replaced.append(module)
        yield
    finally:
        for module in replaced:
            del vars(module)["forward"]
