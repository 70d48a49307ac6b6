"""Deterministic, resumable, host-sharded batches from token files, built on grain's index-based datasets.

Every row is a pure function of its global index, so a host reads only its own rows and a resumed run
continues from a step number with no replay:

    rows of a token file split -> shuffle (seeded, reshuffled every epoch) -> repeat forever -> mix blended
      files by weight -> batch(rows per host) -> every shard_count-th batch from shard_index
      -> decoder_input_tokens / decoder_target_tokens / decoder_loss_weights (+ decoder_segment_ids /
         decoder_positions when packing): t5x_like/features.py

Global batch k is the concatenation of host batches k of hosts 0..shard_count-1, i.e. exactly batch k of
a single host reading batch_size * shard_count rows. Validation and test read their rows once, in order, the
files one after the other, and end after the last global batch (filled up with rows that count nothing).

Rows are SEQ_LEN+1 tokens: inputs are `row[:-1]`, targets `row[1:]`. Without packing a row is a window of
the concatenated documents (windows overlap by one token), every target counts. With packing a row holds
whole documents back to back (a document longer than a row is cut into row-sized pieces), padded at the
end; segment ids number the documents 1, 2, ... (0 = padding), positions restart at 0 for each, and a
target counts only when it is in the same document as its input.
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import grain
import numpy as np
from absl import flags

from t5x_like.data.counted_rows import PaddingRows, RampRows, RowsBefore
from t5x_like.data.fingerprint import completed, describe_change
from t5x_like.data.packing import next_fit, piece_bounds, walk_rows
from t5x_like.data.passes import FilePasses, PassBegun, PassCounter
from t5x_like.data.rampup import SETTING as RAMPUP
from t5x_like.data.rampup import BatchRampup
from t5x_like.data.token_file import TokenFile
from t5x_like.errors import UserError
from t5x_like.features import (DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS, DECODER_SEGMENT_IDS,
                               DECODER_TARGET_TOKENS)

SPLITS = ("train", "validation", "test")


class BatchSource(Protocol):
    """What the trainer iterates: dicts of numpy arrays holding this host's rows of one global batch."""

    vocab_size: int
    eod_id: int
    tokenizer_path: str | None
    num_batches: int | None
    """Batches in one pass over the split (validation, test), None when the batches never end (training)."""
    rows_per_epoch: int | None
    """Rows in one pass over the split (training's too: EPOCHS counts in them), None when not known (a stream)."""
    passes_begun: Sequence[PassBegun]
    """The passes over the training files that the latest batch begins (passes.py; the step loop logs them once
    it has trained that batch's step)."""

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]: ...

    def __next__(self) -> dict[str, np.ndarray]: ...

    def get_state(self) -> dict:
        """JSON-serialisable position; `set_state` of it continues with the next batch."""

    def set_state(self, state: dict) -> None: ...

    def reset(self) -> None:
        """Back to the first batch (used before every evaluation pass over the validation split)."""

    def close(self) -> None:
        """Release files and worker processes."""


DATA_STATE_FORMAT = "t5x_like.data_position/1"


class DataChangedError(UserError):
    """A resume on data other than the checkpoint's (its fingerprint differs)."""


class GrainBatchSource:
    """A `BatchSource` over grain batches of a row stream (`batches(start_row)` builds them from a row on).

    Its state says where it stands in rows, with what it reads: a resume with another global batch (BATCH_SIZE,
    or the hosts) continues at the next unseen row; one with other FEATURE_LENGTHS reads rows of another length,
    and starts about as many tokens in; one on other data (the `fingerprint`: files, tokenizer, split, blend) is
    refused (DataChangedError), and so is one that changes a batch-size ramp-up's stream (`rampup`: its settings,
    BATCH_SIZE and FEATURE_LENGTHS must stay). `passes` says which rows of a training stream begin an epoch."""

    def __init__(self, batches: Callable[[int], grain.IterDataset], *, vocab_size: int, eod_id: int,
                 tokenizer_path: str | None, global_batch: int, lengths: dict[str, int],
                 fingerprint: dict | None = None, data_paths: Sequence[str] = (), num_batches: int | None = None,
                 rows_per_epoch: int | None = None, rampup: BatchRampup | None = None,
                 passes: PassCounter | None = None):
        self.vocab_size = vocab_size
        self.eod_id = eod_id
        self.tokenizer_path = tokenizer_path
        self.num_batches = num_batches
        self.rows_per_epoch = rows_per_epoch  # rows of one pass over the split (EPOCHS counts in them)
        self.global_batch, self.lengths, self.fingerprint = global_batch, dict(lengths), fingerprint
        self._ramp, self._ramp_record = rampup, None if rampup is None else rampup.record()
        self._passes, self.passes_begun = passes, []
        self._batches, self._paths = batches, list(data_paths)
        self._iterator = None
        self._start(0)
        self._initial_state = self._iterator.get_state()

    def _start(self, row: int) -> None:
        if self._iterator is not None:
            self._iterator.close()
        self._start_row, self._read = row, 0
        self._iterator = iter(self._batches(row))

    def __iter__(self) -> GrainBatchSource:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        if self._passes is not None:
            self.passes_begun = self._passes.begun(*self._trained_rows(self.rows_read))
        self._read += 1
        return batch

    def _trained_rows(self, first: int) -> tuple[int, int]:
        """[first, end) of the rows of the stream that the global batch starting at row `first` trains on (a ramp-up
        step's b(s) rows, BatchRampup.counted)."""
        if self._ramp is None:
            return first, first + self.global_batch
        step = first // self.global_batch
        start = self._ramp.consumed_before(step)
        return start, start + self._ramp.batch_at(step)

    @property
    def rows_read(self) -> int:
        """Rows of the stream before the next batch (every host's: global batches times their rows)."""
        return self._start_row + self._read * self.global_batch

    def get_state(self) -> dict:
        return {"format": DATA_STATE_FORMAT, "rows": self.rows_read, "start_row": self._start_row,
                "iterator": self._iterator.get_state(), "global_batch": self.global_batch, "lengths": self.lengths,
                "fingerprint": None if self.fingerprint is None else completed(self.fingerprint, self._paths),
                "rampup": self._ramp_record}

    def set_state(self, state: dict) -> None:
        old_format = state.get("format") != DATA_STATE_FORMAT  # written by an older version: grain's state alone
        self.check_same_rampup({} if old_format else state)
        if old_format:
            self._iterator.set_state(state)
            return
        self.check_same_data(state)
        if state["lengths"] == self.lengths and state["global_batch"] == self.global_batch:
            if state["start_row"] != self._start_row:
                self._start(state["start_row"])
            self._iterator.set_state(state["iterator"])
            self._read = (state["rows"] - state["start_row"]) // self.global_batch
            return
        if state["lengths"] == self.lengths:
            row = state["rows"]
            logging.warning("data: the checkpoint's run read %d rows a step, this one reads %d (BATCH_SIZE, or the "
                            "hosts): continuing at row %d, the first it has not trained on", state["global_batch"],
                            self.global_batch, row)
        else:
            row = round(state["rows"] * sum(state["lengths"].values()) / sum(self.lengths.values()))
            logging.warning("data: the checkpoint's run read rows of FEATURE_LENGTHS=%s, this one %s: rows of another "
                            "length are another sequence of rows; continuing at row %d, about as many tokens into "
                            "the data (%d rows of the old length were read)", state["lengths"], self.lengths, row,
                            state["rows"])
        self._start(row)

    def check_same_rampup(self, state: dict) -> None:
        """UserError when `state` was saved reading a batch-size ramp-up's stream and this source reads another
        (another ramp-up or none, or the same one over another BATCH_SIZE or FEATURE_LENGTHS): the rows of a step
        would not be the ones the checkpoint's run would have read."""
        saved = state.get("rampup")
        if saved is None and self._ramp_record is None:
            return
        same_batches = state["global_batch"] == self.global_batch and state["lengths"] == self.lengths
        if saved == self._ramp_record and same_batches:
            return
        raise UserError(
            f"the checkpoint's data position was read with {RAMPUP}={ramp_setting(saved)} (BATCH_SIZE="
            f"{state.get('global_batch')}, FEATURE_LENGTHS={state.get('lengths')}), this run reads with {RAMPUP}="
            f"{ramp_setting(self._ramp_record)} (BATCH_SIZE={self.global_batch}, FEATURE_LENGTHS={self.lengths}): a "
            "ramp-up's rows follow from these, so keep the checkpoint's values to resume (after the ramp-up, "
            f"{RAMPUP}=None with --gin.train.restart_data=True starts the data over).")

    def check_same_data(self, state: dict) -> None:
        """DataChangedError when `state` was saved reading other data than this source's."""
        if self.fingerprint is None or not state.get("fingerprint"):
            return
        change = describe_change(state["fingerprint"], self.fingerprint, self._paths)
        if change:
            raise DataChangedError(
                f"the data is not what the checkpoint trained on: {change}. Resuming would continue at row "
                f"{state['rows']:,} of other data. Give DATA_PATH the data the run trained on, or set "
                "--gin.train.restart_data=True to start the data over (the model keeps its training).")

    def reset(self) -> None:
        if self._start_row:
            self._start(0)
        self._iterator.set_state(self._initial_state)
        self._read = 0

    def close(self) -> None:
        """Stops loader worker processes now rather than at garbage collection."""
        self._iterator.close()


def ramp_setting(record: dict | None) -> str:
    """BATCH_SIZE_RAMPUP's value as a data position records it (its "rampup": BatchRampup.record())."""
    return "None" if record is None else f"({record['start']}, {record['increment']}, {record['samples']})"


def split_documents(data_split: str, num_documents: int, split: str, name: str) -> tuple[int, int]:
    """The [first, last) documents of `split` under Megatron-style ratios like "949,50,1" (contiguous)."""
    try:
        ratios = np.array([float(r) for r in data_split.split(",")])
    except ValueError:
        ratios = np.array([])
    if len(ratios) != 3 or (ratios < 0).any() or ratios.sum() <= 0:
        raise UserError(f"DATA_SPLIT={data_split!r}: expected three non-negative ratios train,validation,test "
                        "like '949,50,1'")
    bounds = np.round(np.concatenate([[0], np.cumsum(ratios) / ratios.sum()]) * num_documents).astype(int)
    index = SPLITS.index(split)
    first, last = int(bounds[index]), int(bounds[index + 1])
    if first == last:
        hint = " (or train without validation: EVAL_EVERY=0)" if split == "validation" else ""
        raise UserError(f"{name}: DATA_SPLIT={data_split!r} leaves the {split} split none of its "
                        f"{num_documents} documents; give it a larger ratio{hint}")
    return first, last


class Windows:
    """grain data source: row i is tokens[start + i*T : start + i*T + T + 1] of the concatenated documents."""

    def __init__(self, tokens: np.ndarray, start: int, end: int, seq_len: int):
        self._tokens, self._start, self._seq_len = tokens, start, seq_len
        self._len = max(0, (end - start - 1) // seq_len)

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        begin = self._start + i * self._seq_len
        return {"tokens": self._tokens[begin:begin + self._seq_len + 1].astype(np.int32)}


class PackedRows:
    """grain data source: row i holds whole documents (pieces of longer ones), planned greedily in order."""

    def __init__(self, tokens: np.ndarray, document_offsets: np.ndarray, seq_len: int):
        self._tokens, self._row_len = tokens, seq_len + 1
        self._bounds = piece_bounds(np.asarray(document_offsets, np.int64), self._row_len)
        self._rows = walk_rows(next_fit(np.diff(self._bounds), self._row_len))

    def __len__(self) -> int:
        return len(self._rows) - 1

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        pieces = self._bounds[self._rows[i]:self._rows[i + 1] + 1]
        begin, end = int(pieces[0]), int(pieces[-1])
        lengths = np.diff(pieces)
        tokens = np.zeros(self._row_len, np.int32)
        tokens[:end - begin] = self._tokens[begin:end]
        segments = np.zeros(self._row_len, np.int32)
        segments[:end - begin] = np.repeat(np.arange(1, len(lengths) + 1, dtype=np.int32), lengths)
        positions = np.zeros(self._row_len, np.int32)
        positions[:end - begin] = np.arange(end - begin) - np.repeat(pieces[:-1] - begin, lengths)
        return {"tokens": tokens, "segments": segments, "positions": positions}


def split_rows(file: TokenFile, split: str, *, data_split: str, seq_len: int, packing: bool) -> Windows | PackedRows:
    """One pass over the rows of one file's split (a grain data source)."""
    name = f"{file.prefix} ({split})"
    first, last = split_documents(data_split, file.num_documents, split, file.prefix)
    if packing:
        source = PackedRows(file.tokens, file.offsets[first:last + 1], seq_len)
    else:
        source = Windows(file.tokens, int(file.offsets[first]), int(file.offsets[last]), seq_len)
    if len(source) == 0:
        raise UserError(f"{name}: {file.offsets[last] - file.offsets[first]} tokens, fewer than one row of "
                        f"SEQ_LEN+1 = {seq_len + 1}; lower SEQ_LEN or give the split more documents")
    return source


def split_pass(source, name: str, split: str, seed: int) -> grain.MapDataset:
    """A grain data source's rows as `split` reads them: training shuffled per epoch, forever; validation and
    test once, in order (every row counted once)."""
    rows = grain.MapDataset.source(source)
    if split != "train":
        return rows
    return FilePasses(rows.shuffle(seed=seed).repeat(), name, len(source))


def combine(datasets: Sequence[grain.MapDataset], weights: Sequence[float] | None, split: str) -> grain.MapDataset:
    """Several files' rows as one: training mixes them by `weights`; validation and test take each file's rows
    once, one file after the other."""
    if weights is not None and len(weights) != len(datasets):
        raise UserError(f"blend_weights={list(weights)}: {len(weights)} weights for {len(datasets)} data paths")
    if weights is not None and min(weights) <= 0:
        raise UserError(f"blend_weights={list(weights)}: every weight must be positive; leave out a data path "
                        "instead of giving it weight 0")
    if len(datasets) == 1:
        return datasets[0]
    return grain.MapDataset.mix(list(datasets), weights) if split == "train" else \
        grain.MapDataset.concatenate(list(datasets))


def batch_source(rows: grain.MapDataset, *, batch_size: int, shard_index: int, shard_count: int, worker_count: int,
                 vocab_size: int, eod_id: int, tokenizer_path: str | None, feature_lengths: dict[str, int],
                 fingerprint: dict | None = None, data_paths: Sequence[str] = (),
                 arrays: Callable[[dict], dict] | None = None, rampup: BatchRampup | None = None,
                 passes: PassCounter | None = None) -> GrainBatchSource:
    """This host's slice of every global batch of `rows` (`arrays` turns a batch of rows into the features,
    when the rows are not features already). Endless rows (training) give endless batches; one pass over a
    split gives ceil(rows / global batch) batches, the last filled up with padding rows that count nothing
    (zero loss weights, no label). With a batch-size ramp-up (training: `rampup`, of the global batch), global
    batch s holds the b(s) rows step s trains on, then rows that count nothing (RampRows).
    `fingerprint` identifies the data (fingerprint.data_fingerprint); `passes` counts a training stream's epochs.
    """
    num_rows = len(rows) if len(rows) < sys.maxsize else None
    global_batch = batch_size * shard_count
    counted = None
    if num_rows is not None:
        rows = rows.repeat(-(-global_batch // num_rows) + 1)[:-(-num_rows // global_batch) * global_batch]
        counted = RowsBefore(num_rows)
    if rampup is not None:
        if num_rows is not None or rampup.batch_size != global_batch:
            raise ValueError(f"a batch-size ramp-up to {rampup.batch_size} rows reads an endless training stream in "
                             f"global batches of as many rows, not {num_rows} rows in batches of {global_batch}")
        rows, counted = RampRows(rows, rampup), rampup.counted

    def batches(start_row: int) -> grain.IterDataset:
        host = host_slice(rows[start_row:] if start_row else rows, batch_size=batch_size, shard_index=shard_index,
                          shard_count=shard_count)
        if arrays is not None:
            host = host.map(arrays)
        if counted is not None:
            host = host.map_with_index(PaddingRows(counted, batch_size, shard_index, shard_count))
        return prefetched(host, worker_count)

    return GrainBatchSource(batches, vocab_size=vocab_size, eod_id=eod_id, tokenizer_path=tokenizer_path,
                            global_batch=global_batch, lengths=feature_lengths, fingerprint=fingerprint,
                            data_paths=data_paths,
                            num_batches=None if num_rows is None else -(-num_rows // global_batch),
                            rows_per_epoch=num_rows if passes is None else passes.rows_per_pass, rampup=rampup,
                            passes=passes)


def host_slice(rows: grain.MapDataset, *, batch_size: int, shard_index: int, shard_count: int) -> grain.MapDataset:
    """Batches of `batch_size` rows, every `shard_count`-th from `shard_index`: this host's part of each
    global batch."""
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} is not in [0, shard_count={shard_count})")
    return rows.batch(batch_size, drop_remainder=True)[shard_index::shard_count]


def prefetched(batches: grain.MapDataset, worker_count: int) -> grain.IterDataset:
    """Batches read ahead by threads, and prepared in `worker_count` processes when > 0."""
    dataset = batches.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4))
    if worker_count > 0:
        ensure_absl_flags_parsed()
        dataset = dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    return dataset


def ensure_absl_flags_parsed() -> None:
    """grain's worker processes read absl flags; outside an absl app (tests, notebooks) none were parsed."""
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def window_arrays(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens = rows["tokens"]
    return {DECODER_INPUT_TOKENS: tokens[:, :-1], DECODER_TARGET_TOKENS: tokens[:, 1:],
            DECODER_LOSS_WEIGHTS: np.ones(tokens[:, 1:].shape, np.float32)}


def packed_arrays(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tokens, segments = rows["tokens"], rows["segments"]
    same_document = (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] > 0)
    return {DECODER_INPUT_TOKENS: tokens[:, :-1], DECODER_TARGET_TOKENS: tokens[:, 1:],
            DECODER_LOSS_WEIGHTS: same_document.astype(np.float32), DECODER_SEGMENT_IDS: segments[:, :-1],
            DECODER_POSITIONS: rows["positions"][:, :-1]}
