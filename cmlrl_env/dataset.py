"""Task items in order: the first arrow of the data flow (dataset → item).

The order is set by ``item_order`` and the seed of the last ``reset(seed=...)`` (``rewind``):

- ``"dataset"`` (default): dataset order, wrapping round, **starting at item ``seed % len``**.
  Seeds ``s, s+1, …, s+k-1`` (what vector envs give their copies) start ``k`` copies on ``k``
  different items, and they stay apart in lock-step; ``seed=0`` and no seed start at item 0.
  A streamed dataset restarts its stream and skips ``seed % length`` items (it reads at most one
  pass to learn the length).
- ``"shuffle"``: every pass over a map-style dataset is a fresh permutation drawn from
  ``(seed, pass)``; with no seed the permutation comes from fresh OS entropy.

A seed always restarts the order, so ``reset(seed=s)`` twice plays the same items; a reset
without a seed continues it.

The trainers read the same ``TaskSource`` (through ``CoMLRLEnv.epoch_items``) in plain dataset
order, one epoch at a time (SPEC §2): ``epoch_items(epoch, start)`` is the position a resumed run
restores (its epoch and the items of it already trained on).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, cast

import numpy as np
from datasets import Dataset, IterableDataset

__all__ = [
    "ITEM_ORDERS",
    "TaskSource",
    "check_seed",
    "no_items_error",
    "stream_pass",
]

ITEM_ORDERS = ("dataset", "shuffle")


def check_seed(seed: object) -> int | None:
    """``seed`` as an ``int >= 0`` (or ``None``), or a clear error naming it."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(
            f"seed must be None or an int >= 0, got {type(seed).__name__} {seed!r:.80}; "
            "e.g. env.reset(seed=0)."
        )
    if seed < 0:
        raise ValueError(f"seed must be None or an int >= 0, got {seed}; e.g. env.reset(seed=0).")
    return int(seed)


def no_items_error(name: str, pass_number: int | None) -> ValueError:
    """The one message env and trainers give when a stream yields nothing on a pass."""
    if pass_number == 1:
        return ValueError(
            f"{name} is empty: the IterableDataset yielded no items; give at least one task item."
        )
    where = "again" if pass_number is None else f"on pass {pass_number}"
    return ValueError(
        f"{name} yielded no items {where}: it is an IterableDataset that cannot restart (a "
        "one-shot stream, e.g. from_generator over a generator that is already used up), or an "
        "empty one. A second pass (another epoch, a wrap-round or a reset(seed=...)) needs a "
        "stream that starts over when iterated again: build it with "
        "IterableDataset.from_generator(fn) where fn creates a fresh generator, or use a "
        "map-style Dataset."
    )


def stream_pass(
    dataset: Iterable[Mapping[str, Any]], *, name: str, pass_number: int | None
) -> Iterator[dict[str, Any]]:
    """One pass over a streamed dataset; a pass with no item raises ``no_items_error``."""
    count = 0
    for item in dataset:
        count += 1
        yield dict(item)
    if count == 0:
        raise no_items_error(name, pass_number)


class TaskSource:
    """The one owner of dataset -> task item, for the env and the trainers (see module doc).

    ``next()`` walks the env's order (``item_order``, restarted by ``rewind``); ``position``
    counts the items it handed out since the last ``rewind``. ``epoch_items`` reads one epoch in
    dataset order, as the trainers do; it does not move the env's order.
    """

    def __init__(
        self,
        dataset: Dataset | IterableDataset,
        *,
        name: str = "dataset",
        item_order: str = "dataset",
    ) -> None:
        if not isinstance(dataset, (Dataset, IterableDataset)):
            raise TypeError(
                f"{name} must be a datasets.Dataset or datasets.IterableDataset, got "
                f"{type(dataset).__name__}; build one with Dataset.from_dict({{'prompt': [...]}})."
            )
        if isinstance(dataset, Dataset) and len(dataset) == 0:
            raise ValueError(f"{name} is empty (0 rows); give at least one task item.")
        if item_order not in ITEM_ORDERS:
            raise ValueError(f"item_order must be one of {ITEM_ORDERS}, got {item_order!r}.")
        if item_order == "shuffle" and not isinstance(dataset, Dataset):
            raise ValueError(
                "item_order='shuffle' needs a map-style Dataset, but "
                f"{name} is an IterableDataset; shuffle the stream itself with "
                f"{name}.shuffle(seed=..., buffer_size=...) and use item_order='dataset'."
            )
        self.dataset = dataset
        self.name = name
        self.item_order = item_order
        self.seed: int | None = None
        self.position = 0
        self._permutation: tuple[int, np.ndarray] | None = None  # (pass, order) cache
        self._entropy: int | None = None
        self._iterator: Iterator[dict[str, Any]] | None = None
        self._stream_index = 0  # index of the next streamed item within its pass
        self._stream_length: int | None = None  # known after one full pass
        self._passes = 0
        self._skip = 0

    @property
    def is_map_style(self) -> bool:
        return isinstance(self.dataset, Dataset)

    def __len__(self) -> int:
        if not isinstance(self.dataset, Dataset):
            raise TypeError(f"{self.name} is an IterableDataset and has no length.")
        return len(self.dataset)

    def rewind(self, seed: int | None) -> None:
        """Restart the order from ``seed`` (``None``: the unseeded start)."""
        self.seed = check_seed(seed)
        self.position = 0
        self._permutation = None
        self._entropy = None
        if not self.is_map_style:
            self._iterator = None
            self._skip = self.seed or 0

    def get(self, index: int) -> dict[str, Any]:
        """The item at ``index`` of a map-style dataset."""
        if not isinstance(self.dataset, Dataset):
            raise TypeError(
                f"options={{'index': {index}}} needs a map-style Dataset, but {self.name} is an "
                "IterableDataset; pass options={'item': {...}} instead."
            )
        integral = isinstance(index, numbers.Integral) and not isinstance(index, bool)
        if not integral or not 0 <= index < len(self):
            raise IndexError(
                f"index {index!r} is outside {self.name} (0..{len(self) - 1}); pass an int in "
                "range."
            )
        return dict(self.dataset[int(index)])

    def next(self) -> tuple[dict[str, Any], int]:
        """The next item of the order and its index within the dataset (or its stream pass)."""
        if isinstance(self.dataset, Dataset):
            index = self._map_index(self.position, len(self.dataset))
            self.position += 1
            return dict(self.dataset[index]), index
        while self._skip:
            self._pull()
            self._skip -= 1
            if self._stream_length:  # skipping whole passes changes nothing
                self._skip %= self._stream_length
        self.position += 1
        return self._pull()

    def epoch_items(
        self,
        epoch: int | None,
        start: int = 0,
        limit: int | None = None,
        *,
        name: str | None = None,
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """``(index, item)`` of epoch ``epoch`` (1-based; None for a read outside the epochs,
        e.g. an evaluation) in dataset order, from index ``start`` (to ``limit``): how trainers
        read their train and eval items (SPEC §2).

        A stream is read from its beginning on every call (``start`` items skipped); a stream
        that yields nothing is refused as ``next()`` refuses it (empty, or one-shot on a later
        epoch), instead of silently training on no items. ``name`` names the dataset in errors.
        """
        name = self.name if name is None else name
        if isinstance(self.dataset, Dataset):
            stop = len(self.dataset) if limit is None else min(limit, len(self.dataset))
            for index in range(start, stop):
                yield index, dict(self.dataset[index])
            return
        for index, item in enumerate(stream_pass(self.dataset, name=name, pass_number=epoch)):
            if limit is not None and index >= limit:
                return
            if index >= start:
                yield index, item

    def _map_index(self, position: int, n: int) -> int:
        if self.item_order == "dataset":
            return ((self.seed or 0) + position) % n
        pass_number, offset = divmod(position, n)
        if self._permutation is None or self._permutation[0] != pass_number:
            root = self.seed
            if root is None:
                if self._entropy is None:  # a SeedSequence without entropy draws an int
                    self._entropy = int(cast(int, np.random.SeedSequence().entropy))
                root = self._entropy
            order = np.random.default_rng([root, pass_number]).permutation(n)
            self._permutation = (pass_number, order)
        return int(self._permutation[1][offset])

    def _pull(self) -> tuple[dict[str, Any], int]:
        """The next streamed item; the end of a pass starts the next one."""
        for _ in range(2):
            if self._iterator is None:
                self._passes += 1
                self._iterator = stream_pass(self.dataset, name=self.name, pass_number=self._passes)
                self._stream_index = 0
            try:
                item = next(self._iterator)
            except StopIteration:
                self._iterator = None
                self._stream_length = self._stream_index
                continue
            index = self._stream_index
            self._stream_index += 1
            return item, index
        raise AssertionError("unreachable: a fresh pass either yields or raises no_items_error")
