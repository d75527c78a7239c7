"""Task items in dataset order: the first arrow of the data flow (dataset → item)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from datasets import Dataset, IterableDataset

__all__ = ["TaskSource"]


class TaskSource:
    """Hands out task items of a Hugging Face ``Dataset`` or ``IterableDataset`` in order.

    Order is the dataset's own (SPEC §2: users shuffle before building the env); the source wraps
    round at the end. ``position`` counts items handed out and survives checkpoints.
    """

    def __init__(self, dataset: Dataset | IterableDataset, *, name: str = "dataset") -> None:
        if not isinstance(dataset, (Dataset, IterableDataset)):
            raise TypeError(
                f"{name} must be a datasets.Dataset or datasets.IterableDataset, got "
                f"{type(dataset).__name__}; build one with Dataset.from_dict({{'prompt': [...]}})."
            )
        if isinstance(dataset, Dataset) and len(dataset) == 0:
            raise ValueError(f"{name} is empty (0 rows); give at least one task item.")
        self.dataset = dataset
        self.name = name
        self.position = 0
        self._iterator: Iterator[Mapping[str, Any]] | None = None

    @property
    def is_map_style(self) -> bool:
        return isinstance(self.dataset, Dataset)

    def __len__(self) -> int:
        if not isinstance(self.dataset, Dataset):
            raise TypeError(f"{self.name} is an IterableDataset and has no length.")
        return len(self.dataset)

    def get(self, index: int) -> dict[str, Any]:
        """The item at ``index`` of a map-style dataset."""
        if not isinstance(self.dataset, Dataset):
            raise TypeError(
                f"options={{'index': {index}}} needs a map-style Dataset, but {self.name} is an "
                "IterableDataset; pass options={'item': {...}} instead."
            )
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self):
            raise IndexError(
                f"index {index!r} is outside {self.name} (0..{len(self) - 1}); pass an int in "
                "range."
            )
        return dict(self.dataset[index])

    def next(self) -> tuple[dict[str, Any], int]:
        """The next item in dataset order and its index within the dataset (wrapping round)."""
        if isinstance(self.dataset, Dataset):
            index = self.position % len(self.dataset)
            self.position += 1
            return dict(self.dataset[index]), index
        return self._next_streamed()

    def _next_streamed(self) -> tuple[dict[str, Any], int]:
        for _ in range(2):
            if self._iterator is None:
                self._iterator = iter(self.dataset)
                self._epoch_start = self.position
            try:
                item = next(self._iterator)
            except StopIteration:
                if self.position == self._epoch_start:
                    raise ValueError(f"{self.name} yielded no items; give at least one.") from None
                self._iterator = None
                continue
            index = self.position - self._epoch_start
            self.position += 1
            return dict(item), index
        raise AssertionError("unreachable: a fresh iterator either yields or raised above")

    def seek(self, position: int) -> None:
        """Restore the position (resume): the next item is the one after ``position`` handed out."""
        self.position = 0
        self._iterator = None
        if isinstance(self.dataset, Dataset):
            self.position = position
            return
        for _ in range(position):
            self._next_streamed()
