"""The non-causal data objectives behind the loader: T5's span corruption of token files and seq2seq
input/target pairs; BERT's masked-LM pre-training and classification fine-tuning (at the end of the file).

Both give rows of seqio-named features, FEATURE_LENGTHS {'inputs': N, 'targets': M} long:

    encoder_input_tokens [N]  encoder_segment_ids [N] (1 = real, 0 = padding; the examples 1, 2, ... packed)
    decoder_target_tokens [M]  decoder_input_tokens [M]  decoder_loss_weights [M]
    + encoder_positions, decoder_segment_ids, decoder_positions when packing

`decoder_input_tokens` are the targets shifted right with 0 as the start id, per example; segment ids
number a row's examples 1, 2, ... (0 = padding) and positions restart at 0 for each.

Span corruption (T5's `span_corruption`). Examples are `raw_length` tokens, the length T5's
`random_spans_helper` chooses so that a corrupted example fills N inputs (568 for 512 / 114 at noise
density 0.15, mean noise span length 3): windows of the split's concatenated documents, or with packing
the documents cut into pieces of at most that length, several per row. Each example's noise mask is
T5's `random_spans_noise_mask` (a non-noise span first, then noise / non-noise alternating, a noise span
last; span lengths a uniformly random split of the counts), drawn from (seed, file, index of the row in the
endless stream): a resumed run draws the same masks, every epoch new ones. Inputs keep the non-noise tokens
and one sentinel per noise span; targets hold each sentinel followed by its span; both end with EOS.
Sentinels count down from the top of the vocabulary, `<extra_id_i>` = vocab_size - 1 - i: the tokenizer's
own vocabulary when it has the `<extra_id_*>` pieces (Hugging Face T5 tokenizers), else the tokenizer's
plus 100 extra ids, as seqio does (32000 + 100 for T5's spiece.model: `<extra_id_0>` = 32099).

Seq2seq. Pairs from JSONL (one `{"inputs": ..., "targets": ...}` per line) or TSV (a header row naming the
`inputs` and `targets` columns), tokenized when the source is made, or from token files `P.inputs` and
`P.targets` (document i of each is pair i; made by preprocess with --noappend_eod). Each side is cut to its
length - 1 and EOS is appended (T5's append_eos_after_trim); the number of pairs cut is logged. One pair per
row padded, or with packing as many consecutive pairs as fit both lengths.

Masked-LM (FEATURE_LENGTHS {'inputs': N}). Documents are cut into pieces of at most N - 2 tokens, each a
row `[CLS] piece [SEP]` (padded; encoder_segment_ids 1 / 0) or, packed, several per row (segment ids 1, 2,
..., encoder_positions restarting). BERT's masking (`mlm_mask`) selects round(15 %) of the non-special
tokens, whole words with whole-word masking, 80/10/10 [MASK] / random / kept, drawn from (seed, file, row
index in the endless stream) as span corruption's. Features: encoder_input_tokens, encoder_segment_ids,
encoder_token_types (0), encoder_target_tokens, encoder_loss_weights (1 where selected).

Classification. Examples from JSONL / TSV (`text`, optional `text_pair`, `label`; BoolQ's `question`,
`passage`, `label`), one per row `[CLS] text [SEP] text_pair [SEP]` (token types 0 / 1; RoBERTa's
`<s> text </s></s> text_pair </s>`), cut longest-first; classification_labels [1] is the label's index.

Rows then take the causal-LM loader's path: shuffled per epoch (train), repeated, blended, batched, sliced
per host; the iterator state is a position, so resume is exact.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import grain
import numpy as np

from t5x_like.data import builtin, loader
from t5x_like.data.fingerprint import data_fingerprint
from t5x_like.data.loader import BatchSource, GrainBatchSource
from t5x_like.data.sources import token_files_vocabulary
from t5x_like.data.token_file import TokenFile, open_token_file, token_dtype
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer
from t5x_like.errors import UserError
from t5x_like.features import (CLASSIFICATION_LABELS, ENCODER_INPUT_TOKENS, ENCODER_LOSS_WEIGHTS, ENCODER_POSITIONS,
                               ENCODER_SEGMENT_IDS, ENCODER_TARGET_TOKENS, ENCODER_TOKEN_TYPES)

NUM_EXTRA_IDS = 100  # seqio's extra_ids: sentinels <extra_id_0> .. <extra_id_99> above the tokenizer's pieces
PAIR_FIELDS = ("inputs", "targets")
PAIR_FORMATS = (".jsonl", ".tsv")


def random_spans_helper(inputs_length: int, noise_density: float, mean_noise_span_length: float) -> tuple[int, int]:
    """T5's `random_spans_helper` (one sentinel per span): the longest raw example whose corrupted inputs,
    EOS included, fit `inputs_length`, and the targets length it needs. (512, 0.15, 3.0) -> (568, 114)."""
    def corrupted(tokens_length: int) -> tuple[int, int]:
        num_noise = int(round(tokens_length * noise_density))
        num_spans = int(round(num_noise / mean_noise_span_length))
        return tokens_length - num_noise + num_spans + 1, num_noise + num_spans + 1

    tokens_length = inputs_length
    while corrupted(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    inputs, targets = corrupted(tokens_length)
    if noise_density == 0.5 and targets > inputs:  # T5's tweak: targets no longer than the (rounder) inputs
        tokens_length, targets = tokens_length - 1, targets - 1
    return tokens_length, targets


def span_counts(lengths, noise_density: float, mean_noise_span_length: float) -> tuple[np.ndarray, np.ndarray]:
    """(noise tokens, noise spans) of T5's `random_spans_noise_mask` for examples of `lengths` >= 2 tokens,
    computed in float32 like T5's TensorFlow (rounding halves to even)."""
    lengths = np.asarray(lengths, np.int64)
    noise = np.rint(lengths.astype(np.float32) * np.float32(noise_density)).astype(np.int64)
    noise = np.clip(noise, 1, lengths - 1)
    spans = np.rint(noise.astype(np.float32) / np.float32(mean_noise_span_length)).astype(np.int64)
    return noise, np.maximum(spans, 1)


def corrupted_lengths(lengths, noise_density: float, mean_noise_span_length: float) -> tuple[np.ndarray, np.ndarray]:
    """Lengths of the inputs and targets (EOS included) span corruption makes of examples of `lengths` tokens.

    A 1-token example stays whole (T5 draws a 2-token mask and keeps its non-noise first token): inputs
    [token, EOS], targets [<extra_id_0>, EOS]."""
    lengths = np.asarray(lengths, np.int64)
    noise, spans = span_counts(np.maximum(lengths, 2), noise_density, mean_noise_span_length)
    single = lengths == 1
    return np.where(single, 2, lengths - noise + spans + 1), np.where(single, 2, noise + spans + 1)


def noise_mask(length: int, noise_density: float, mean_noise_span_length: float,
               rng: np.random.Generator) -> np.ndarray:
    """T5's `random_spans_noise_mask`: True on noise tokens; spans alternate non-noise / noise, non-noise first."""
    padded = max(length, 2)
    noise, spans = (int(n) for n in span_counts(padded, noise_density, mean_noise_span_length))
    noise_lengths = _random_segmentation(noise, spans, rng)
    nonnoise_lengths = _random_segmentation(padded - noise, spans, rng)
    span_lengths = np.stack([nonnoise_lengths, noise_lengths], axis=1).ravel()
    return np.repeat(np.tile([False, True], spans), span_lengths)[:length]


def _random_segmentation(num_items: int, num_segments: int, rng: np.random.Generator) -> np.ndarray:
    """Lengths of `num_segments` non-empty segments splitting `num_items` items, every split equally likely."""
    cuts = np.sort(rng.choice(num_items - 1, num_segments - 1, replace=False)) + 1
    return np.diff(np.concatenate([[0], cuts, [num_items]]))


def span_corrupt(tokens: np.ndarray, mask: np.ndarray, first_sentinel: int,
                 eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) of T5's span corruption: inputs are the tokens with each noise span replaced by one
    sentinel (`first_sentinel`, then one lower for each next span); targets are the tokens with each
    non-noise span replaced, i.e. every sentinel followed by the span it stands for. Both end with EOS."""
    inputs = _spans_to_sentinels(tokens, mask, first_sentinel)
    targets = _spans_to_sentinels(tokens, ~mask, first_sentinel)
    return np.append(inputs, eos_id), np.append(targets, eos_id)


def _spans_to_sentinels(tokens: np.ndarray, mask: np.ndarray, first_sentinel: int) -> np.ndarray:
    """T5's `noise_span_to_unique_sentinel`: each run of masked tokens becomes one sentinel, counting down."""
    previous = np.concatenate([[False], mask[:-1]])
    starts = mask & ~previous
    replaced = np.where(starts, first_sentinel + 1 - np.cumsum(starts), tokens)
    return replaced[~(mask & previous)]


def vocabulary_with_sentinels(tokenizer: Tokenizer) -> tuple[int, int]:
    """(vocab size including the sentinels, number of sentinels); `<extra_id_i>` = vocab size - 1 - i.

    A tokenizer with `<extra_id_*>` pieces must hold them counting down from its last id; one without gets
    NUM_EXTRA_IDS ids above its own (T5's sentencepiece model: 32000 pieces + 100)."""
    found = []
    while (piece_id := tokenizer.token_to_id(f"<extra_id_{len(found)}>")) is not None:
        found.append(piece_id)
    if not found:
        return tokenizer.vocab_size + NUM_EXTRA_IDS, NUM_EXTRA_IDS
    expected = list(range(tokenizer.vocab_size - 1, tokenizer.vocab_size - 1 - len(found), -1))
    if found != expected:
        raise UserError(f"{tokenizer.path}: its pieces <extra_id_0>.. have ids {found[:4]}..., but T5's sentinels "
                        f"count down from the last id ({expected[:4]}...); use a tokenizer whose <extra_id_*> "
                        "pieces are its last ids, or one without them (100 sentinels are then added above it)")
    return tokenizer.vocab_size, len(found)


def row_features(examples: Sequence[tuple[np.ndarray, np.ndarray]], feature_lengths: dict[str, int],
                 packed: bool) -> dict[str, np.ndarray]:
    """One row of seqio features from (inputs, targets) examples that together fit `feature_lengths`."""
    encoder = _concatenated([inputs for inputs, _ in examples], feature_lengths["inputs"])
    decoder = _concatenated([targets for _, targets in examples], feature_lengths["targets"])
    shifted = _concatenated([np.concatenate([[0], targets[:-1]]) for _, targets in examples],
                            feature_lengths["targets"])
    row = {"encoder_input_tokens": encoder[0], "decoder_target_tokens": decoder[0],
           "decoder_input_tokens": shifted[0], "decoder_loss_weights": (decoder[1] > 0).astype(np.float32),
           "encoder_segment_ids": encoder[1]}  # unpacked: the encoder's padding mask (EOS may be id 0)
    if packed:
        row |= {"encoder_positions": encoder[2], "decoder_segment_ids": decoder[1], "decoder_positions": decoder[2]}
    return row


def _concatenated(sequences: list[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, segment ids, positions) of `sequences` back to back, zero-padded to `length`."""
    lengths = [len(s) for s in sequences]
    used = sum(lengths)
    tokens, segments, positions = (np.zeros(length, np.int32) for _ in range(3))
    tokens[:used] = np.concatenate(sequences)
    segments[:used] = np.repeat(np.arange(1, len(sequences) + 1), lengths)
    positions[:used] = np.concatenate([np.arange(n) for n in lengths])
    return tokens, segments, positions


def row_starts(inputs_lengths: np.ndarray, targets_lengths: np.ndarray, feature_lengths: dict[str, int],
               packed: bool) -> np.ndarray:
    """Where rows start among the examples, plus the end: one example per row, or with packing as many
    consecutive examples as fit both lengths (each fits alone)."""
    if not packed:
        return np.arange(len(inputs_lengths) + 1)
    return loader.walk_rows(np.minimum(_next_fit(inputs_lengths, feature_lengths["inputs"]),
                                       _next_fit(targets_lengths, feature_lengths["targets"])))


def _next_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    ends = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    return np.searchsorted(ends, ends + capacity, side="right") - 1


class ExampleRows:
    """grain data source: row i is the list of examples `example(j)` for j in starts[i] .. starts[i+1]-1."""

    def __init__(self, example, starts: np.ndarray):
        self._example, self._starts = example, starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i: int) -> list:
        return [self._example(j) for j in range(self._starts[i], self._starts[i + 1])]


class _Windows:
    """Example j: tokens[start + j*length : start + (j+1)*length]."""

    def __init__(self, tokens: np.ndarray, start: int, length: int):
        self._tokens, self._start, self._length = tokens, start, length

    def __call__(self, j: int) -> np.ndarray:
        begin = self._start + j * self._length
        return np.asarray(self._tokens[begin:begin + self._length])


class _Pieces:
    """Example j: tokens[bounds[j]:bounds[j+1]]."""

    def __init__(self, tokens: np.ndarray, bounds: np.ndarray):
        self._tokens, self._bounds = tokens, bounds

    def __call__(self, j: int) -> np.ndarray:
        return np.asarray(self._tokens[self._bounds[j]:self._bounds[j + 1]])


class _Pairs:
    """Example j: (document first+j of `inputs`, the same of `targets`)."""

    def __init__(self, inputs: TokenFile, targets: TokenFile, first: int):
        self._inputs, self._targets, self._first = inputs, targets, first

    def __call__(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        return self._inputs.document(self._first + j), self._targets.document(self._first + j)


class CorruptSpans:
    """map_with_index: a row's raw examples -> seqio features; masks drawn from (seed, salt, row index)."""

    def __init__(self, *, noise_density: float, mean_noise_span_length: float, first_sentinel: int, eos_id: int,
                 feature_lengths: dict[str, int], packed: bool, seed: int, salt: int):
        self._spans = (noise_density, mean_noise_span_length)
        self._first_sentinel, self._eos_id = first_sentinel, eos_id
        self._feature_lengths, self._packed, self._key = feature_lengths, packed, (seed, salt)

    def __call__(self, index: int, examples: list[np.ndarray]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([*self._key, index])
        corrupted = [span_corrupt(tokens, noise_mask(len(tokens), *self._spans, rng), self._first_sentinel,
                                  self._eos_id) for tokens in examples]
        return row_features(corrupted, self._feature_lengths, self._packed)


class TrimPairs:
    """map: a row's raw (inputs, targets) pairs -> seqio features, each side cut to its length - 1, then EOS."""

    def __init__(self, *, eos_id: int, feature_lengths: dict[str, int], packed: bool):
        self._eos_id, self._feature_lengths, self._packed = eos_id, feature_lengths, packed

    def __call__(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        keep_inputs, keep_targets = self._feature_lengths["inputs"] - 1, self._feature_lengths["targets"] - 1
        trimmed = [(np.append(inputs[:keep_inputs], self._eos_id), np.append(targets[:keep_targets], self._eos_id))
                   for inputs, targets in pairs]
        return row_features(trimmed, self._feature_lengths, self._packed)


def make_span_corruption_source(split: str, *, batch_size: int, feature_lengths: dict[str, int], seed: int,
                                shard_index: int, shard_count: int,
                                data_path: str | list[str] | None = None,
                                blend_weights: list[float] | None = None,
                                tokenizer: str | None = None,
                                data_split: str = "949,50,1",
                                packing: bool = False,
                                noise_density: float = 0.15,
                                mean_noise_span_length: float = 3.0,
                                worker_count: int = 0) -> BatchSource:
    """T5 span-corruption batches of `split` for this host (`batch_size` rows of it).

    `data_path`, `blend_weights`, `tokenizer`, `data_split` and `worker_count` as for `make_source` (no
    `data_path`: the builtin corpus); the tokenizer must load, since the sentinels come from it. `packing`
    packs document pieces several per row; without it, examples are windows of the concatenated documents,
    each filling its row (T5's default, merging examples to reduce padding)."""
    lengths = _checked_feature_lengths(feature_lengths, split, batch_size)
    if data_path is None:
        data_path, tokenizer = builtin.builtin_corpus()
    files = [open_token_file(p) for p in _as_list(data_path)]
    _, _, tokenizer_path = token_files_vocabulary(files, tokenizer)
    loaded = _load_tokenizer(tokenizer_path, ", ".join(f.prefix for f in files))
    vocab_size, num_sentinels = vocabulary_with_sentinels(loaded)
    raw_length = _raw_length(lengths, noise_density, mean_noise_span_length, num_sentinels)
    rows = []
    for salt, file in enumerate(files):
        corrupt = CorruptSpans(noise_density=noise_density, mean_noise_span_length=mean_noise_span_length,
                               first_sentinel=vocab_size - 1, eos_id=loaded.eod_id, feature_lengths=lengths,
                               packed=packing, seed=seed, salt=salt)
        source = _span_examples(file, split, data_split, raw_length, lengths, packing,
                                (noise_density, mean_noise_span_length))
        rows.append(loader.split_pass(source, f"{file.prefix} ({split})", split, seed).map_with_index(corrupt))
    fingerprint = data_fingerprint([f.prefix for f in files], loaded.sha256, objective="span_corruption",
                                   data_split=data_split, blend_weights=blend_weights, packing=packing, seed=seed,
                                   noise_density=noise_density, mean_noise_span_length=mean_noise_span_length)
    return _batch_source(rows, blend_weights, split, batch_size=batch_size, shard_index=shard_index,
                         shard_count=shard_count, worker_count=worker_count, vocab_size=vocab_size,
                         eod_id=loaded.eod_id, tokenizer_path=tokenizer_path, feature_lengths=lengths,
                         fingerprint=fingerprint, data_paths=[f.prefix for f in files])


def _raw_length(lengths: dict[str, int], noise_density: float, mean_noise_span_length: float,
                num_sentinels: int) -> int:
    """T5's raw example length for these lengths, checked against the lengths the masks really give (T5's
    helper rounds in float64, its masks in float32: at a few lengths the targets need 2 more tokens)."""
    if not 0 < noise_density < 1 or mean_noise_span_length < 1:
        raise UserError(f"noise_density={noise_density}, mean_noise_span_length={mean_noise_span_length}: "
                        "expected a density in (0, 1) and a mean span length >= 1")
    raw_length, _ = random_spans_helper(lengths["inputs"], noise_density, mean_noise_span_length)
    sizes = np.arange(1, raw_length + 1)
    inputs, targets = corrupted_lengths(sizes, noise_density, mean_noise_span_length)
    noise, spans = span_counts(np.maximum(sizes, 2), noise_density, mean_noise_span_length)
    if (np.maximum(sizes, 2) - noise < spans).any():
        raise UserError(f"noise_density={noise_density}, mean_noise_span_length={mean_noise_span_length}: more "
                        "noise spans than non-noise tokens to separate them; lower the density")
    if inputs.max() > lengths["inputs"]:
        raise UserError(f"FEATURE_LENGTHS={lengths}: {lengths['inputs']} inputs are too few for span corruption; "
                        "raise FEATURE_LENGTHS['inputs']")
    if targets.max() > lengths["targets"]:
        raise UserError(f"FEATURE_LENGTHS={lengths}: span corruption of {raw_length} tokens into "
                        f"{lengths['inputs']} inputs needs {targets.max()} targets; set FEATURE_LENGTHS['targets'] "
                        f"to {targets.max()} (or more)")
    if spans.max() > num_sentinels:
        raise UserError(f"FEATURE_LENGTHS={lengths}: examples of {raw_length} tokens have up to {spans.max()} noise "
                        f"spans but the vocabulary has {num_sentinels} sentinels; lower FEATURE_LENGTHS['inputs']")
    return raw_length


def _span_examples(file: TokenFile, split: str, data_split: str, raw_length: int, lengths: dict[str, int],
                   packing: bool, spans: tuple[float, float]) -> ExampleRows:
    """Rows of raw examples of `split`: windows of `raw_length` tokens, or packed document pieces."""
    first, last = loader.split_documents(data_split, file.num_documents, split, file.prefix)
    start, end = int(file.offsets[first]), int(file.offsets[last])
    if packing:
        bounds = np.unique(loader.piece_bounds(file.offsets[first:last + 1], raw_length))  # no empty pieces
        rows = ExampleRows(_Pieces(file.tokens, bounds),
                           row_starts(*corrupted_lengths(np.diff(bounds), *spans), lengths, packed=True))
    else:
        rows = ExampleRows(_Windows(file.tokens, start, raw_length), np.arange((end - start) // raw_length + 1))
    if len(rows) == 0:
        raise UserError(f"{file.prefix} ({split}): {end - start} tokens, fewer than one span-corruption example of "
                        f"{raw_length}; lower FEATURE_LENGTHS['inputs'] or give the split more documents")
    return rows


def make_seq2seq_source(split: str, *, batch_size: int, feature_lengths: dict[str, int], seed: int,
                        shard_index: int, shard_count: int,
                        data_path: str | list[str] | dict[str, str | list[str]],
                        blend_weights: list[float] | None = None,
                        tokenizer: str | None = None,
                        data_split: str = "949,50,1",
                        packing: bool = False,
                        worker_count: int = 0) -> BatchSource:
    """Batches of input/target pairs of `split` for this host (`batch_size` rows of it).

    `data_path`: a `.jsonl` / `.tsv` file of pairs (tokenized with `tokenizer`, then required) or the prefix
    P of token files `P.inputs` + `P.targets`; several are blended by `blend_weights`. Each is split into
    train/validation/test by pair with `data_split`, unless `data_path` is a dict naming each split's files,
    e.g. {'train': 'train.jsonl', 'validation': 'dev.jsonl'}. `packing` packs several pairs per row."""
    lengths = _checked_feature_lengths(feature_lengths, split, batch_size)
    paths, whole = _split_paths(data_path, split)
    token_files = {p: _open_pair_files(p) for p in paths if not p.endswith(PAIR_FORMATS)}
    if tokenizer is None and not token_files:
        raise UserError(f"data_path={data_path!r}: set TOKENIZER (make_seq2seq_source.tokenizer) to tokenize the "
                        "pairs with")
    if token_files:
        _, _, tokenizer = token_files_vocabulary([f for pair in token_files.values() for f in pair], tokenizer)
    loaded = _load_tokenizer(tokenizer, ", ".join(paths))
    vocab_size, _ = vocabulary_with_sentinels(loaded)
    trim = TrimPairs(eos_id=loaded.eod_id, feature_lengths=lengths, packed=packing)
    rows = []
    for path in paths:
        inputs, targets = token_files[path] if path in token_files else _tokenized_pairs(path, loaded)
        source = _pair_examples(inputs, targets, path, split, None if whole else data_split, lengths, packing)
        rows.append(loader.split_pass(source, f"{path} ({split})", split, seed).map(trim))
    files = [f"{p}.{side}" for p in paths if p in token_files for side in ("inputs", "targets")] + \
        [p for p in paths if p not in token_files]
    fingerprint = data_fingerprint(files, loaded.sha256, objective="seq2seq", data_split=None if whole else data_split,
                                   blend_weights=blend_weights, packing=packing, seed=seed)
    return _batch_source(rows, blend_weights, split, batch_size=batch_size, shard_index=shard_index,
                         shard_count=shard_count, worker_count=worker_count, vocab_size=vocab_size,
                         eod_id=loaded.eod_id, tokenizer_path=tokenizer, feature_lengths=lengths,
                         fingerprint=fingerprint, data_paths=files)


def _split_paths(data_path, split: str) -> tuple[list[str], bool]:
    """(paths of `split`, whether they belong to it whole) for a path, a list of them or a dict by split."""
    if not isinstance(data_path, dict):
        return _as_list(data_path), False
    if split not in data_path:
        raise UserError(f"data_path={data_path!r} names no files for the {split} split; add {split!r}: [...]")
    return _as_list(data_path[split]), True


def _pair_examples(inputs: TokenFile, targets: TokenFile, path: str, split: str, data_split: str | None,
                   lengths: dict[str, int], packing: bool) -> ExampleRows:
    """Rows of raw pairs of `split` (all pairs when `data_split` is None); logs how many get cut."""
    first, last = (0, inputs.num_documents) if data_split is None else \
        loader.split_documents(data_split, inputs.num_documents, split, path)
    inputs_lengths = np.diff(inputs.offsets[first:last + 1])
    targets_lengths = np.diff(targets.offsets[first:last + 1])
    logging.info("data: %s (%s): %d pairs; %d inputs longer than %d and %d targets longer than %d tokens are cut "
                 "(FEATURE_LENGTHS, EOS included)", path, split, last - first,
                 np.sum(inputs_lengths >= lengths["inputs"]), lengths["inputs"],
                 np.sum(targets_lengths >= lengths["targets"]), lengths["targets"])
    starts = row_starts(np.minimum(inputs_lengths + 1, lengths["inputs"]),
                        np.minimum(targets_lengths + 1, lengths["targets"]), lengths, packing)
    return ExampleRows(_Pairs(inputs, targets, first), starts)


def _open_pair_files(prefix: str) -> tuple[TokenFile, TokenFile]:
    """The token files `prefix.inputs` and `prefix.targets`, checked to hold the same pairs without EOS."""
    if Path(prefix).is_file():
        raise UserError(f"{prefix}: pairs must be in a file named *.jsonl or *.tsv")
    inputs, targets = open_token_file(prefix + ".inputs"), open_token_file(prefix + ".targets")
    if inputs.num_documents != targets.num_documents:
        raise UserError(f"{prefix}.inputs / .targets: {inputs.num_documents} and {targets.num_documents} documents; "
                        "they must hold one document per pair (preprocess drops empty documents: keep none empty)")
    for f in (inputs, targets):
        if (f.metadata or {}).get("append_eod"):
            raise UserError(f"{f.prefix}.json: made with EOD appended, but the loader appends EOS after cutting to "
                            "FEATURE_LENGTHS; re-run preprocess with --noappend_eod")
    return inputs, targets


def _tokenized_pairs(path: str, tokenizer: Tokenizer) -> tuple[TokenFile, TokenFile]:
    """The pairs of a JSONL / TSV file tokenized into in-memory token files (inputs, targets)."""
    pairs = read_pairs(path)
    sides = []
    for field, texts in zip(PAIR_FIELDS, zip(*pairs)):
        ids, counts = tokenizer.encode_documents(texts, append_eod=False)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        sides.append(TokenFile(f"{path} ({field})", ids.astype(token_dtype(tokenizer.vocab_size)), offsets, None))
    return sides[0], sides[1]


def read_pairs(path: str) -> list[tuple[str, str]]:
    """The (inputs, targets) strings of a JSONL or TSV file; bad lines raise UserError naming file and line."""
    if not path.endswith(PAIR_FORMATS):
        raise UserError(f"{path}: pairs must be in a file named *.jsonl or *.tsv")
    with open(path, "rb") as f:
        lines = [(number, _decoded(raw, path, number)) for number, raw in enumerate(f, 1)]
    lines = [(number, line.rstrip("\r\n")) for number, line in lines if line.strip()]
    pairs = _jsonl_pairs(path, lines) if path.endswith(".jsonl") else _tsv_pairs(path, lines)
    if not pairs:
        raise UserError(f"{path}: no pairs (an empty file?)")
    return pairs


def _decoded(raw: bytes, path: str, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}:{number}: bytes that are not UTF-8 ({raw[e.start:e.end]!r}); re-encode the "
                        "file as UTF-8") from None


def _jsonl_pairs(path: str, lines: list[tuple[int, str]]) -> list[tuple[str, str]]:
    records = _jsonl_records(path, lines, "fields 'inputs' and 'targets'")
    return [tuple(_field(value, field, path, number) for field in PAIR_FIELDS) for number, value in records]


def _field(value: dict, field: str, path: str, number: int) -> str:
    if field not in value:
        raise UserError(f"{path}:{number}: no field {field!r} (fields: {', '.join(value) or 'none'}); each line "
                        "needs string fields 'inputs' and 'targets'")
    if not isinstance(value[field], str):
        raise UserError(f"{path}:{number}: field {field!r} is {type(value[field]).__name__}, expected a string")
    return _nonempty(value[field], field, path, number)


def _nonempty(text: str, field: str, path: str, number: int) -> str:
    if not text.strip():
        raise UserError(f"{path}:{number}: an empty {field!r}; every pair needs text on both sides (remove the "
                        "line or fill it in)")
    return text


def _tsv_pairs(path: str, lines: list[tuple[int, str]]) -> list[tuple[str, str]]:
    if not lines:
        return []
    header = lines[0][1].split("\t")
    missing = [field for field in PAIR_FIELDS if field not in header]
    if missing:
        raise UserError(f"{path}:{lines[0][0]}: the header row names no column {missing[0]!r} (columns: "
                        f"{', '.join(header)}); the first row must name the 'inputs' and 'targets' columns")
    columns = [header.index(field) for field in PAIR_FIELDS]
    pairs = []
    for number, line in lines[1:]:
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path}:{number}: {len(fields)} tab-separated fields, but the header has "
                            f"{len(header)}; a field may not contain a tab or a newline")
        pairs.append(tuple(_nonempty(fields[c], field, path, number) for c, field in zip(columns, PAIR_FIELDS)))
    return pairs


def _checked_feature_lengths(feature_lengths: dict[str, int], split: str, batch_size: int) -> dict[str, int]:
    if split not in loader.SPLITS:
        raise UserError(f"split={split!r}: expected one of {loader.SPLITS}")
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size}: must be positive")
    if not isinstance(feature_lengths, dict) or sorted(feature_lengths) != sorted(PAIR_FIELDS) or \
            not all(isinstance(n, int) and n >= 2 for n in feature_lengths.values()):
        raise UserError(f"FEATURE_LENGTHS={feature_lengths!r}: an encoder-decoder objective needs "
                        "{'inputs': N, 'targets': M} with N, M >= 2, e.g. {'inputs': 512, 'targets': 114}")
    return dict(feature_lengths)


def _as_list(data_path: str | list[str]) -> list[str]:
    return [str(data_path)] if isinstance(data_path, (str, Path)) else [str(p) for p in data_path]


def _load_tokenizer(path: str, data: str) -> Tokenizer:
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as e:
        raise UserError(f"{data}: tokenizer {path} does not load ({e}); set TOKENIZER to the tokenizer the data "
                        "was made with") from None


def _batch_source(rows: list[grain.MapDataset], blend_weights: list[float] | None, split: str, **kwargs
                  ) -> GrainBatchSource:
    return loader.batch_source(loader.combine(rows, blend_weights, split), **kwargs)


# -- Masked-LM pre-training (BERT, RoBERTa): OBJECTIVE = 'mlm' ----------------------------------------------

MLM_SPECIAL_TOKENS = (("[CLS]", "[SEP]", "[MASK]", "[PAD]"), ("<s>", "</s>", "<mask>", "<pad>"))
"""(classifier, separator, mask, padding) pieces of BERT's WordPiece and RoBERTa's BPE vocabularies."""
NUM_MLM_EXTRA_IDS = 3
"""Ids a vocabulary without those pieces gets above its own: [CLS], [SEP], [MASK] (padding is id 0)."""


@dataclasses.dataclass(frozen=True)
class MLMVocabulary:
    """The ids masked-LM rows use. `vocab_size` counts the added ids; random replacements are drawn
    from the tokenizer's own `random_ids` ids; `special_ids` are never selected for masking."""

    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    random_ids: int
    special_ids: tuple[int, ...]


def mlm_vocabulary(tokenizer: Tokenizer) -> MLMVocabulary:
    """The tokenizer's [CLS]/[SEP]/[MASK]/[PAD] (or RoBERTa's <s>/</s>/<mask>/<pad>) ids, or, when it has
    none of them (a GPT-style BPE such as the builtin corpus's), NUM_MLM_EXTRA_IDS ids above its own."""
    for pieces in MLM_SPECIAL_TOKENS:
        ids = [tokenizer.token_to_id(piece) for piece in pieces]
        if all(i is None for i in ids[:3]):
            continue
        if any(i is None for i in ids[:3]):
            missing = [piece for piece, i in zip(pieces[:3], ids) if i is None]
            raise UserError(f"{tokenizer.path}: has {', '.join(p for p, i in zip(pieces[:3], ids) if i is not None)} "
                            f"but not {', '.join(missing)}; masked-LM training needs all of {', '.join(pieces[:3])} "
                            "(or none of them, and then gets its own ids above the vocabulary)")
        cls_id, sep_id, mask_id, pad_id = ids
        pad_id = 0 if pad_id is None else pad_id
        specials = {cls_id, sep_id, mask_id, pad_id, tokenizer.eod_id}
        return MLMVocabulary(tokenizer.vocab_size, cls_id, sep_id, mask_id, pad_id, tokenizer.vocab_size,
                             tuple(sorted(specials)))
    v = tokenizer.vocab_size
    return MLMVocabulary(v + NUM_MLM_EXTRA_IDS, v, v + 1, v + 2, 0, v, (tokenizer.eod_id, v, v + 1, v + 2))


def word_starts(tokenizer: Tokenizer) -> np.ndarray:
    """bool [vocab]: whether each piece begins a word. WordPiece continues words with `##` pieces;
    byte-level BPE begins them with a space (a piece decoding to ' the' starts a word, 'ing' does not)."""
    texts = [tokenizer.decode([i]) for i in range(tokenizer.vocab_size)]
    if any(text.startswith("##") for text in texts):
        return np.array([not text.startswith("##") for text in texts])
    return np.array([text[:1].isspace() for text in texts])


def mlm_mask(tokens: np.ndarray, maskable: np.ndarray, starts_word: np.ndarray, rate: float,
             vocab: MLMVocabulary, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masking of one example: round(rate x maskable tokens) (at least 1) are selected, whole words
    at a time (a word: a maskable token where `starts_word`, and the maskable tokens after it that do
    not), words taken in random order and skipped when they would overshoot; of the selected, 80 % become
    [MASK], 10 % a random id, 10 % stay. Returns (inputs, fp32 weights: 1 at the selected positions)."""
    positions = np.flatnonzero(maskable)
    weights = np.zeros(len(tokens), np.float32)
    if len(positions) == 0:
        return tokens.copy(), weights
    new_word = starts_word | (np.diff(positions, prepend=-2) != 1)
    word_of = np.cumsum(new_word) - 1
    word_lengths = np.bincount(word_of)
    wanted = max(1, int(round(len(positions) * rate)))
    chosen, total = np.zeros(len(word_lengths), bool), 0
    for word in rng.permutation(len(word_lengths)):
        if total + word_lengths[word] <= wanted:
            chosen[word], total = True, total + word_lengths[word]
            if total == wanted:
                break
    selected = positions[chosen[word_of]]
    weights[selected] = 1.0
    draw = rng.random(len(selected))
    inputs = tokens.copy()
    inputs[selected[draw < 0.8]] = vocab.mask_id
    randomised = selected[(draw >= 0.8) & (draw < 0.9)]
    inputs[randomised] = rng.integers(0, vocab.random_ids, len(randomised))
    return inputs, weights


class MaskTokens:
    """map_with_index: a row's document pieces -> masked-LM features; each piece becomes [CLS] piece [SEP],
    masked by `mlm_mask` with a generator seeded by (seed, salt, row index in the endless stream)."""

    def __init__(self, *, vocab: MLMVocabulary, starts_word: np.ndarray | None, rate: float, length: int,
                 packed: bool, seed: int, salt: int):
        self._vocab, self._starts_word, self._rate = vocab, starts_word, rate
        self._length, self._packed, self._key = length, packed, (seed, salt)
        self._specials = np.array(vocab.special_ids)

    def __call__(self, index: int, pieces: list[np.ndarray]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([*self._key, index])
        v = self._vocab
        examples = []
        for piece in pieces:
            tokens = np.concatenate([[v.cls_id], piece[~np.isin(piece, self._specials)], [v.sep_id]]).astype(np.int32)
            maskable = ~np.isin(tokens, self._specials)
            starts = np.ones(int(maskable.sum()), bool) if self._starts_word is None else \
                self._starts_word[np.minimum(tokens[maskable], len(self._starts_word) - 1)]
            examples.append((tokens, *mlm_mask(tokens, maskable, starts, self._rate, v, rng)))
        return mlm_row(examples, self._length, self._packed, v.pad_id)


def mlm_row(examples: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], length: int, packed: bool,
            pad_id: int) -> dict[str, np.ndarray]:
    """One row of encoder-only features from (targets, inputs, weights) examples that together fit `length`."""
    inputs, segments, positions = _concatenated([e[1] for e in examples], length)
    targets = _concatenated([e[0] for e in examples], length)[0]
    weights = np.zeros(length, np.float32)
    weights[:sum(len(e[2]) for e in examples)] = np.concatenate([e[2] for e in examples])
    inputs[segments == 0] = pad_id
    row = {ENCODER_INPUT_TOKENS: inputs, ENCODER_SEGMENT_IDS: segments, ENCODER_TOKEN_TYPES: np.zeros(length, np.int32),
           ENCODER_TARGET_TOKENS: targets, ENCODER_LOSS_WEIGHTS: weights}
    if packed:
        row[ENCODER_POSITIONS] = positions
    return row


def make_mlm_source(split: str, *, batch_size: int, feature_lengths: dict[str, int], seed: int,
                    shard_index: int, shard_count: int,
                    data_path: str | list[str] | None = None,
                    blend_weights: list[float] | None = None,
                    tokenizer: str | None = None,
                    data_split: str = "949,50,1",
                    packing: bool = False,
                    mask_rate: float = 0.15,
                    whole_word_masking: bool = False,
                    worker_count: int = 0) -> BatchSource:
    """Masked-LM batches of `split` for this host (`batch_size` rows of it), FEATURE_LENGTHS {'inputs': N}.

    Documents of the token files (the builtin corpus without `data_path`) are cut into pieces of at most
    N - 2 tokens; each piece is a row [CLS] piece [SEP] (padded), or with `packing` as many pieces as fit
    go into one row (segment ids 1, 2, ..., positions restarting). `mask_rate` of the non-special tokens
    are selected (80 % [MASK], 10 % random, 10 % kept), whole words at a time with `whole_word_masking`;
    the masks are a pure function of (seed, file, row index in the endless stream): new every epoch,
    the same after a resume."""
    lengths = _checked_encoder_lengths(feature_lengths, split, batch_size)
    if not 0 < mask_rate < 1:
        raise UserError(f"mask_rate={mask_rate}: the share of tokens masked must be in (0, 1), BERT uses 0.15")
    if data_path is None:
        data_path, tokenizer = builtin.builtin_corpus()
    files = [open_token_file(p) for p in _as_list(data_path)]
    _, _, tokenizer_path = token_files_vocabulary(files, tokenizer)
    loaded = _load_tokenizer(tokenizer_path, ", ".join(f.prefix for f in files))
    vocab = mlm_vocabulary(loaded)
    starts_word = word_starts(loaded) if whole_word_masking else None
    rows = []
    for salt, file in enumerate(files):
        mask = MaskTokens(vocab=vocab, starts_word=starts_word, rate=mask_rate, length=lengths["inputs"],
                          packed=packing, seed=seed, salt=salt)
        source = _mlm_pieces(file, split, data_split, lengths["inputs"], packing, loaded.eod_id)
        rows.append(loader.split_pass(source, f"{file.prefix} ({split})", split, seed).map_with_index(mask))
    fingerprint = data_fingerprint([f.prefix for f in files], loaded.sha256, objective="mlm", data_split=data_split,
                                   blend_weights=blend_weights, packing=packing, seed=seed, mask_rate=mask_rate,
                                   whole_word_masking=whole_word_masking)
    return _batch_source(rows, blend_weights, split, batch_size=batch_size, shard_index=shard_index,
                         shard_count=shard_count, worker_count=worker_count, vocab_size=vocab.vocab_size,
                         eod_id=loaded.eod_id, tokenizer_path=tokenizer_path, feature_lengths=lengths,
                         fingerprint=fingerprint, data_paths=[f.prefix for f in files])


def _mlm_pieces(file: TokenFile, split: str, data_split: str, length: int, packing: bool,
                eod_id: int) -> ExampleRows:
    """Rows of document pieces of at most length - 2 tokens besides the end-of-document id (left out when the
    row is made): one per row, or packed with their [CLS]/[SEP]. A piece that would hold only a document's
    end-of-document id joins the piece before it."""
    first, last = loader.split_documents(data_split, file.num_documents, split, file.prefix)
    bounds = np.unique(loader.piece_bounds(file.offsets[first:last + 1], length - 2))
    lone_eod = (np.diff(bounds) == 1) & (np.asarray(file.tokens[bounds[:-1]]) == eod_id)
    bounds = np.delete(bounds, np.flatnonzero(lone_eod[1:]) + 1)
    sizes = np.diff(bounds) - (np.asarray(file.tokens[bounds[1:] - 1]) == eod_id) + 2
    starts = loader.walk_rows(_next_fit(sizes, length)) if packing else np.arange(len(bounds))
    rows = ExampleRows(_Pieces(file.tokens, bounds), starts)
    if len(rows) == 0:
        raise UserError(f"{file.prefix} ({split}): no documents in this split; give the split more documents "
                        f"(DATA_SPLIT={data_split!r})")
    return rows


def _checked_encoder_lengths(feature_lengths: dict[str, int], split: str, batch_size: int) -> dict[str, int]:
    if split not in loader.SPLITS:
        raise UserError(f"split={split!r}: expected one of {loader.SPLITS}")
    if batch_size < 1:
        raise UserError(f"batch_size={batch_size}: must be positive")
    if not isinstance(feature_lengths, dict) or set(feature_lengths) != {"inputs"} or \
            not isinstance(feature_lengths["inputs"], int) or feature_lengths["inputs"] < 3:
        raise UserError(f"FEATURE_LENGTHS={feature_lengths!r}: an encoder-only objective needs {{'inputs': N}} "
                        "with N >= 3, e.g. {'inputs': 512}")
    return dict(feature_lengths)


# -- Classification fine-tuning (BERT, RoBERTa): OBJECTIVE = 'classification' -----------------------------

CLASSIFICATION_FIELDS = ("text", "text_pair", "label")
BOOLQ_FIELDS = ("question", "passage", "label")
"""SuperGLUE BoolQ's own JSONL: question and passage become text and text_pair, its true/false label the
label (label list ['False', 'True'])."""


@dataclasses.dataclass(frozen=True)
class LabelledText:
    text: str
    text_pair: str | None
    label: str


def read_labelled(path: str) -> list[LabelledText]:
    """The examples of a JSONL (`text`, optional `text_pair`, `label`; or BoolQ's `question`, `passage`,
    `label`) or TSV file (a header row naming those columns). Labels are kept as strings (JSON true/false
    -> 'True'/'False', integers -> '0', '1', ...); bad lines raise UserError naming file and line."""
    if not path.endswith(PAIR_FORMATS):
        raise UserError(f"{path}: classification examples must be in a file named *.jsonl or *.tsv")
    with open(path, "rb") as f:
        lines = [(number, _decoded(raw, path, number).rstrip("\r\n")) for number, raw in enumerate(f, 1)]
    lines = [(number, line) for number, line in lines if line.strip()]
    rows = _jsonl_records(path, lines) if path.endswith(".jsonl") else _tsv_records(path, lines)
    examples = [_labelled(record, path, number) for number, record in rows]
    if not examples:
        raise UserError(f"{path}: no examples (an empty file?)")
    return examples


def _jsonl_records(path: str, lines: list[tuple[int, str]], fields: str = "fields 'text' and 'label' (and "
                   "optionally 'text_pair')") -> list[tuple[int, dict]]:
    """(line number, object) of each line of a JSONL file whose objects hold `fields`."""
    records = []
    for number, line in lines:
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{path}:{number}: invalid JSON at column {e.colno} ({e.msg}); each line must be one "
                            f"object with {fields}") from None
        if not isinstance(value, dict):
            raise UserError(f"{path}:{number}: expected a JSON object with {fields}, got {type(value).__name__}")
        records.append((number, value))
    return records


def _tsv_records(path: str, lines: list[tuple[int, str]]) -> list[tuple[int, dict]]:
    if not lines:
        return []
    header = lines[0][1].split("\t")
    records = []
    for number, line in lines[1:]:
        fields = line.split("\t")
        if len(fields) != len(header):
            raise UserError(f"{path}:{number}: {len(fields)} tab-separated fields, but the header has "
                            f"{len(header)}; a field may not contain a tab or a newline")
        records.append((number, dict(zip(header, fields))))
    return records


def _labelled(record: dict, path: str, number: int) -> LabelledText:
    text_field, pair_field = ("question", "passage") if "question" in record and "text" not in record else \
        ("text", "text_pair")
    for field in (text_field, "label"):
        if field not in record:
            raise UserError(f"{path}:{number}: no field {field!r} (fields: {', '.join(record) or 'none'}); each "
                            "example needs 'text' and 'label' (and optionally 'text_pair'), or BoolQ's "
                            "'question', 'passage' and 'label'")
    texts = [record[text_field], record.get(pair_field)]
    for field, value in zip((text_field, pair_field), texts):
        if value is not None and not isinstance(value, str):
            raise UserError(f"{path}:{number}: field {field!r} is {type(value).__name__}, expected a string")
    label = record["label"]
    if not isinstance(label, (str, int, bool)):
        raise UserError(f"{path}:{number}: label {label!r} is {type(label).__name__}; labels are strings, "
                        "integers or true/false")
    return LabelledText(texts[0], texts[1], str(label))


def label_ids(examples: Sequence[LabelledText], labels: Sequence[str], path: str) -> np.ndarray:
    """Each example's index in the label list; a label outside it raises UserError naming it and the fix."""
    index = {str(label): i for i, label in enumerate(labels)}
    unknown = sorted({e.label for e in examples} - set(index))
    if unknown:
        raise UserError(f"{path}: label {unknown[0]!r} is not in the label list {list(labels)}; add it to "
                        "LABELS (data.make_source.labels and model_config.overrides['labels']) or fix the data")
    return np.array([index[e.label] for e in examples], np.int32)


def default_labels(examples: Sequence[LabelledText]) -> list[str]:
    """The label list when none is given: 'False', 'True' for true/false labels, 0 .. max for integers,
    else the labels sorted."""
    found = {e.label for e in examples}
    if found <= {"False", "True"}:
        return ["False", "True"]
    if all(label.isdigit() for label in found):
        return [str(i) for i in range(max(map(int, found)) + 1)]
    return sorted(found)


def encode_pair(tokens: np.ndarray, pair: np.ndarray | None, vocab: MLMVocabulary, roberta_style: bool,
                length: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, token types) of [CLS] text [SEP] (pair [SEP]) cut longest-first to `length`; RoBERTa's
    <s> text </s></s> pair </s> with one token type."""
    separators = 1 if pair is None else (4 if roberta_style else 3)
    a, b = list(tokens), [] if pair is None else list(pair)
    while len(a) + len(b) + separators > length:
        (a if len(a) >= len(b) else b).pop()
    ids = [vocab.cls_id, *a, vocab.sep_id]
    types = [0] * len(ids)
    if pair is not None:
        second = ([vocab.sep_id] if roberta_style else []) + b + [vocab.sep_id]
        ids += second
        types += [0 if roberta_style else 1] * len(second)
    return np.array(ids, np.int32), np.array(types, np.int32)


class ClassificationRows:
    """grain data source: row i is example i as padded encoder-only features with its label."""

    def __init__(self, ids: list[tuple[np.ndarray, np.ndarray]], labels: np.ndarray, length: int, pad_id: int):
        self._ids, self._labels, self._length, self._pad_id = ids, labels, length, pad_id

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        tokens, types = self._ids[i]
        n, row = len(tokens), np.full(self._length, self._pad_id, np.int32)
        row[:n] = tokens
        segments, token_types = np.zeros(self._length, np.int32), np.zeros(self._length, np.int32)
        segments[:n], token_types[:n] = 1, types
        return {ENCODER_INPUT_TOKENS: row, ENCODER_SEGMENT_IDS: segments, ENCODER_TOKEN_TYPES: token_types,
                CLASSIFICATION_LABELS: np.array([self._labels[i]], np.int32)}


def classification_examples(path: str, tokenizer: Tokenizer, labels: Sequence[str] | None,
                            length: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, list[str]]:
    """(per example (ids, token types), label ids, label list) of a JSONL / TSV file."""
    examples = read_labelled(path)
    labels = list(labels) if labels else default_labels(examples)
    vocab = mlm_vocabulary(tokenizer)
    roberta_style = tokenizer.token_to_id(MLM_SPECIAL_TOKENS[1][0]) is not None
    texts = tokenizer.encode_batch([e.text for e in examples])
    pairs = tokenizer.encode_batch([e.text_pair or "" for e in examples])
    ids = [encode_pair(np.array(t), np.array(p) if e.text_pair is not None else None, vocab, roberta_style, length)
           for t, p, e in zip(texts, pairs, examples)]
    return ids, label_ids(examples, labels, path), labels


def make_classification_source(split: str, *, batch_size: int, feature_lengths: dict[str, int], seed: int,
                               shard_index: int, shard_count: int,
                               data_path: str | list[str] | dict[str, str | list[str]],
                               blend_weights: list[float] | None = None,
                               tokenizer: str | None = None,
                               data_split: str = "949,50,1",
                               labels: Sequence[str] | None = None,
                               packing: bool = False,
                               worker_count: int = 0) -> BatchSource:
    """Classification batches of `split` for this host: one example per row, [CLS] text [SEP] (text_pair
    [SEP]) padded to FEATURE_LENGTHS['inputs'] with token types, and its label's index in `labels` (the
    label list; by default 'False'/'True', 0..max or the sorted labels of each file). `data_path`: a .jsonl
    / .tsv file split by example with `data_split`, or a dict naming each split's files."""
    lengths = _checked_encoder_lengths(feature_lengths, split, batch_size)
    if packing:
        raise UserError("OBJECTIVE='classification' takes one example per row; set PACKING=False")
    if tokenizer is None:
        raise UserError(f"data_path={data_path!r}: set TOKENIZER (make_source.tokenizer) to tokenize the examples "
                        "with (the pre-trained model's vocab.txt or tokenizer.json)")
    paths, whole = _split_paths(data_path, split)
    loaded = _load_tokenizer(tokenizer, ", ".join(paths))
    rows = []
    for path in paths:
        ids, label_index, _ = classification_examples(path, loaded, labels, lengths["inputs"])
        first, last = (0, len(ids)) if whole else loader.split_documents(data_split, len(ids), split, path)
        source = ClassificationRows(ids[first:last], label_index[first:last], lengths["inputs"],
                                    mlm_vocabulary(loaded).pad_id)
        rows.append(loader.split_pass(source, f"{path} ({split})", split, seed))
    fingerprint = data_fingerprint(paths, loaded.sha256, objective="classification",
                                   data_split=None if whole else data_split, blend_weights=blend_weights, seed=seed,
                                   labels=labels)
    return _batch_source(rows, blend_weights, split, batch_size=batch_size, shard_index=shard_index,
                         shard_count=shard_count, worker_count=worker_count,
                         vocab_size=mlm_vocabulary(loaded).vocab_size, eod_id=loaded.eod_id, tokenizer_path=tokenizer,
                         feature_lengths=lengths, fingerprint=fingerprint, data_paths=paths)
