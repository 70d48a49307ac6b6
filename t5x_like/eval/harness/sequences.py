"""lm-eval requests as scored token sequences, and sequences packed into batch rows.

A `Scored` sequence is ids[0..n] read as inputs ids[:-1] and targets ids[1:], of which the last `scored`
targets count. A loglikelihood request is one sequence (context + continuation, cut on the left to the
model's length as lm-eval's Hugging Face backend cuts it); a rolling-loglikelihood document is one sequence
per window. Sequences are packed first-fit-decreasing into rows of one bucketed length (segment ids keep them
apart), so a batch of short multiple-choice requests costs few rows.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from t5x_like.features import (DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS, DECODER_SEGMENT_IDS,
                               DECODER_TARGET_TOKENS)

MIN_ROW_LENGTH = 64
"""Row lengths are powers of two from this up (capped by the model's length), so few shapes compile."""


@dataclasses.dataclass(frozen=True)
class Scored:
    """Inputs ids[:-1], targets ids[1:]; the last `scored` targets count."""

    ids: tuple[int, ...]
    scored: int

    @property
    def length(self) -> int:
        return len(self.ids) - 1


def continuation(context: Sequence[int], continuation_ids: Sequence[int], max_length: int) -> Scored:
    """A loglikelihood request: the continuation's tokens scored after the context, the whole cut on the
    left to max_length inputs (as lm-eval's Hugging Face backend does)."""
    if not 0 < len(continuation_ids) <= max_length:
        raise ValueError(f"a continuation of {len(continuation_ids)} tokens does not fit max_length {max_length}")
    return Scored((*context, *continuation_ids)[-(max_length + 1):], len(continuation_ids))


def rolling(tokens: Sequence[int], prefix_id: int, max_length: int, stride: int) -> list[Scored]:
    """A document's windows, scoring each token once: the first window scores its first max_length tokens after
    `prefix_id`; each later one scores the next `stride` tokens with the max_length - 1 tokens before them as
    context (the last window ends at the document's end, so it too reads a full window). stride = max_length
    gives lm-eval's own disjoint windows; a smaller stride gives every target at least max_length - stride
    tokens of context, as `--task=wikitext --stride` does."""
    if not 0 < stride <= max_length:
        raise ValueError(f"stride {stride} must be between 1 and max_length {max_length}")
    stream = (prefix_id, *tokens)
    end = min(max_length, len(tokens))
    windows = [Scored(stream[:end + 1], end)] if tokens else []
    while end < len(tokens):
        start, end = end, min(end + stride, len(tokens))
        windows.append(Scored(stream[max(end - max_length, 0):end + 1], end - start))
    return windows


def row_length(sequences: Sequence[Scored], max_length: int) -> int:
    """The bucketed row length for these sequences: the smallest power of two >= MIN_ROW_LENGTH holding the
    longest, or max_length."""
    longest = max(s.length for s in sequences)
    length = MIN_ROW_LENGTH
    while length < longest:
        length *= 2
    return min(length, max_length)


def pack(sequences: Sequence[Scored], length: int) -> list[list[int]]:
    """Sequence indices per row of `length` tokens, first-fit decreasing (each row's sequences side by side)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(sequences)), key=lambda i: -sequences[i].length):
        need = sequences[index].length
        row = next((r for r, free in enumerate(room) if free >= need), None)
        if row is None:
            rows.append([])
            room.append(length)
            row = len(rows) - 1
        rows[row].append(index)
        room[row] -= need
    return rows


def packed_rows(sequences: Sequence[Scored], rows: Sequence[Sequence[int]], num_rows: int,
                length: int) -> dict[str, np.ndarray]:
    """The batch arrays for `rows` (sequence indices each), zero rows up to num_rows: inputs, targets, weights
    1 on every real target, segment ids 1, 2, ... per row (0: padding), positions from 0 in each sequence."""
    batch = {key: np.zeros((num_rows, length), np.int32)
             for key in (DECODER_INPUT_TOKENS, DECODER_TARGET_TOKENS, DECODER_SEGMENT_IDS, DECODER_POSITIONS)}
    batch[DECODER_LOSS_WEIGHTS] = np.zeros((num_rows, length), np.float32)
    for row, indices in enumerate(rows):
        start = 0
        for segment, index in enumerate(indices, 1):
            ids = np.asarray(sequences[index].ids, np.int32)
            span = slice(start, start + len(ids) - 1)
            batch[DECODER_INPUT_TOKENS][row, span] = ids[:-1]
            batch[DECODER_TARGET_TOKENS][row, span] = ids[1:]
            batch[DECODER_SEGMENT_IDS][row, span] = segment
            batch[DECODER_POSITIONS][row, span] = np.arange(len(ids) - 1)
            batch[DECODER_LOSS_WEIGHTS][row, span] = 1.0
            start = span.stop
    return batch


def scored_spans(sequences: Sequence[Scored], rows: Sequence[Sequence[int]]) -> dict[int, tuple[int, slice]]:
    """Sequence index -> (row, the positions of its scored targets in that row) for `rows` as packed_rows
    lays them out."""
    spans = {}
    for row, indices in enumerate(rows):
        start = 0
        for index in indices:
            end = start + sequences[index].length
            spans[index] = (row, slice(end - sequences[index].scored, end))
            start = end
    return spans
