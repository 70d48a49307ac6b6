"""Which global rows a step reads and which of them count: a batch-size ramp-up's rows (RampRows), the repeats
that fill a pass's last global batch (RowsBefore) and the zero weights of rows that count nothing (PaddingRows)."""
from __future__ import annotations

from collections.abc import Callable

import grain
import numpy as np

from t5x_like.data.rampup import BatchRampup
from t5x_like.features import CLASSIFICATION_LABELS, LOSS_WEIGHTS, NO_LABEL


class RampRows(grain.MapDataset):
    """The training rows as a batch-size ramp-up reads them: row s x G + j (G: the global batch) is the parent's
    row C(s) + j, C(s) being the rows the steps before s trained on. Step s's first b(s) rows are the next ones of
    the stream; the rest (they count nothing: BatchRampup.counted) repeat the next step's first rows."""

    _MUTATES_ELEMENT_SPEC = False

    def __init__(self, parent: grain.MapDataset, rampup: BatchRampup):
        super().__init__(parent)
        self._rampup = rampup

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        step, within = divmod(index, self._rampup.batch_size)
        return self._parent[self._rampup.consumed_before(step) + within]

    def __str__(self) -> str:
        return f"RampRows{self._rampup.setting}"


class RowsBefore:
    """Whether global rows count: those before `num_rows` (the rest fill one pass's last global batch)."""

    def __init__(self, num_rows: int):
        self._num_rows = num_rows

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        return rows < self._num_rows


class PaddingRows:
    """map_with_index over host batches: the rows `counted` (global row indices -> bool) leaves out get zero loss
    weights and no classification label (repeats that fill a pass's last global batch, RowsBefore; rows past a
    ramp-up step's batch, BatchRampup.counted)."""

    def __init__(self, counted: Callable[[np.ndarray], np.ndarray], batch_size: int, shard_index: int,
                 shard_count: int):
        self._counted, self._batch_size, self._shard_index, self._shard_count = \
            counted, batch_size, shard_index, shard_count

    def __call__(self, index: int, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        first = (index * self._shard_count + self._shard_index) * self._batch_size
        real = self._counted(np.arange(first, first + self._batch_size))
        if real.all():
            return batch
        return {name: without_padding_rows(name, array, real) for name, array in batch.items()}


def without_padding_rows(name: str, array: np.ndarray, real: np.ndarray) -> np.ndarray:
    if name in LOSS_WEIGHTS:
        return array * real.reshape(-1, *[1] * (array.ndim - 1)).astype(array.dtype)
    if name == CLASSIFICATION_LABELS:
        return np.where(real.reshape(-1, *[1] * (array.ndim - 1)), array, NO_LABEL).astype(array.dtype)
    return array
