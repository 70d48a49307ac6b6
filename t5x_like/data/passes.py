"""Passes over the training files (epochs), counted in the rows training reads.

Training reads each file's split pass after pass, every pass shuffled anew (FilePasses), blended files mixed by
BLEND_WEIGHTS into one stream. The loader reads that stream ahead of training (grain's read-ahead, worker
processes), so a pass is not announced when its rows are read: PassCounter tells which rows of the stream begin
a pass (row k x N of a file of N rows per pass begins its pass k + 1), and the training source hands the passes
its latest batch begins to the step loop, which logs them once that step is trained:

    data: corpus (train): epoch 2 begins at step 5 (12 rows per epoch)

Epochs are numbered from 1 as users count them (the second pass is "epoch 2"); the first pass is the run's
start and gets no line.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Sequence

import grain


@dataclasses.dataclass(frozen=True)
class PassBegun:
    """Pass `number` (from 1) over `name`'s rows, `rows` of them, begins."""

    name: str
    number: int
    rows: int

    def describe(self, step: int) -> str:
        return f"data: {self.name}: epoch {self.number} begins at step {step} ({self.rows} rows per epoch)"


class FilePasses(grain.MapDataset):
    """A file's training rows read pass after pass (its shuffled, repeated rows, `parent`), unchanged, with the
    file's `name` and its `rows_per_pass` for PassCounter."""

    _MUTATES_ELEMENT_SPEC = False

    def __init__(self, parent: grain.MapDataset, name: str, rows_per_pass: int):
        super().__init__(parent)
        self.name, self.rows_per_pass = name, rows_per_pass

    def __len__(self) -> int:
        return len(self._parent)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return self.slice(index)
        return self._parent[index]

    def __str__(self) -> str:
        return f"FilePasses({self.name}, {self.rows_per_pass} rows)"


def _file_passes(dataset: grain.MapDataset) -> FilePasses | None:
    """The FilePasses a file's training rows were made from (the objective maps its rows after it), or None."""
    while not isinstance(dataset, FilePasses):
        parents = [p for p in dataset.parents if isinstance(p, grain.MapDataset)]
        if len(parents) != 1:
            return None
        dataset = parents[0]
    return dataset


def _tagged(file: int, row: int) -> tuple[int, int]:
    return file, row


class PassCounter:
    """Which rows of a training stream begin a pass over one of its files: the stream of one file's FilePasses,
    or of several mixed by grain with `weights` (the same mix over (file, row) pairs says which file's row each
    stream row is)."""

    def __init__(self, files: Sequence[FilePasses], weights: Sequence[float] | None):
        self._files = [(f.name, f.rows_per_pass) for f in files]
        self._mix = None if len(files) == 1 else grain.MapDataset.mix(
            [grain.MapDataset.range(sys.maxsize).map(functools.partial(_tagged, k)) for k in range(len(files))],
            weights)

    @classmethod
    def of(cls, datasets: Sequence[grain.MapDataset], weights: Sequence[float] | None) -> PassCounter | None:
        """The counter of the training stream `datasets` make mixed by `weights`; None when a dataset was not
        made by FilePasses (its passes are not known)."""
        files = [_file_passes(d) for d in datasets]
        return None if None in files else cls(files, weights)

    @property
    def rows_per_pass(self) -> int:
        """The rows of one pass over every file (EPOCHS counts in them)."""
        return sum(rows for _, rows in self._files)

    def begun(self, first: int, end: int) -> list[PassBegun]:
        """The passes that the stream's rows [first, end) begin, in stream order."""
        if self._mix is None:
            name, rows = self._files[0]
            return [PassBegun(name, k + 1, rows) for k in range(max(1, -(-first // rows)), -(-end // rows))]
        begun = []
        for index in range(first, end):
            file, row = self._mix[index]
            name, rows = self._files[file]
            if row and row % rows == 0:
                begun.append(PassBegun(name, row // rows + 1, rows))
        return begun
