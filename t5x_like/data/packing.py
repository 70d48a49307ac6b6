"""Packing plans: which pieces of which documents (or examples) go into which row, planned greedily in order
(next fit: a row takes the next pieces while they fit). The loader packs causal-LM rows with them, the objectives
their examples (encoder_decoder.row_starts, masked-LM's and span corruption's pieces)."""
from __future__ import annotations

import array

import numpy as np

_PLAN_WINDOW = 1 << 20  # pieces per step of the plan's walk


def piece_bounds(offsets: np.ndarray, row_len: int) -> np.ndarray:
    """Document offsets with extra cuts every `row_len` tokens inside documents longer than a row."""
    lengths = np.diff(offsets)
    pieces = np.maximum(1, -(-lengths // row_len))
    starts = np.repeat(offsets[:-1], pieces)
    within = np.arange(len(starts)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    return np.append(starts + within * row_len, offsets[-1])


def next_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """For each item and the end: the first item that does not fit in a row of `capacity` starting at it."""
    ends = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    return np.searchsorted(ends, ends + capacity, side="right") - 1


def walk_rows(next_row: np.ndarray) -> np.ndarray:
    """Where rows start, plus the end: a row starting at item i ends before item `next_row[i]` (> i).

    `next_row` has one entry per item and one for the end."""
    rows = array.array("q")
    piece, end = 0, len(next_row) - 1
    while piece < end:  # walk the jumps a window at a time: Python ints only for one window
        base = piece
        window = next_row[base:base + _PLAN_WINDOW].tolist()
        while piece < end and piece - base < len(window):
            rows.append(piece)
            piece = window[piece - base]
    rows.append(end)
    return np.array(rows, np.int64)
