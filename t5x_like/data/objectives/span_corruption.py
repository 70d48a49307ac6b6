"""OBJECTIVE = 'span_corruption': T5's pre-training objective over token files.

Examples are `raw_length` tokens, the length T5's `random_spans_helper` chooses so that a corrupted example
fills N inputs (568 for 512 / 114 at noise density 0.15, mean noise span length 3): windows of the split's
concatenated documents, or with packing the documents cut into pieces of at most that length, several per row.
Each example's noise mask is T5's `random_spans_noise_mask` (a non-noise span first, then noise / non-noise
alternating, a noise span last; span lengths a uniformly random split of the counts), drawn from (seed, file,
index of the row in the stream): a resumed run draws the same masks, every epoch new ones. Inputs keep the
non-noise tokens and one sentinel per noise span; targets hold each sentinel followed by its span; both end with
EOS. Sentinels count down from the top of the vocabulary, `<extra_id_i>` = vocab_size - 1 - i: the tokenizer's
own vocabulary when it has the `<extra_id_*>` pieces (Hugging Face T5 tokenizers), else the tokenizer's plus 100
extra ids, as seqio does (32000 + 100 for T5's spiece.model: `<extra_id_0>` = 32099)."""
from __future__ import annotations

import numpy as np

from t5x_like.data import loader
from t5x_like.data.fingerprint import data_fingerprint
from t5x_like.data.loader import BatchSource
from t5x_like.data.objectives.common import (ExampleRows, Pieces, SourceRequest, combined_source, loaded_token_files,
                                             tokenizer_of)
from t5x_like.data.objectives.encoder_decoder import (encoder_decoder_lengths, row_features, row_starts,
                                                      vocabulary_with_sentinels)
from t5x_like.data.packing import piece_bounds
from t5x_like.data.token_file import TokenFile
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.errors import UserError


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


class _Windows:
    """Example j: tokens[start + j*length : start + (j+1)*length]."""

    def __init__(self, tokens: np.ndarray, start: int, length: int):
        self._tokens, self._start, self._length = tokens, start, length

    def __call__(self, j: int) -> np.ndarray:
        begin = self._start + j * self._length
        return np.asarray(self._tokens[begin:begin + self._length])


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


def make_source(request: SourceRequest, *, noise_density: float = 0.15,
                mean_noise_span_length: float = 3.0) -> BatchSource:
    """T5 span-corruption batches of the request's split for this host.

    No DATA_PATH: the builtin corpus; the tokenizer must load, since the sentinels come from it. PACKING
    packs document pieces several per row; without it, examples are windows of the concatenated documents,
    each filling its row (T5's default, merging examples to reduce padding)."""
    lengths, split, seed = encoder_decoder_lengths(request.feature_lengths), request.split, request.seed
    files, tokenizer_path, loaded = loaded_token_files(request)
    vocab_size, num_sentinels = vocabulary_with_sentinels(loaded)
    raw_length = _raw_length(lengths, noise_density, mean_noise_span_length, num_sentinels)
    rows = []
    for salt, file in enumerate(files):
        corrupt = CorruptSpans(noise_density=noise_density, mean_noise_span_length=mean_noise_span_length,
                               first_sentinel=vocab_size - 1, eos_id=loaded.eod_id, feature_lengths=lengths,
                               packed=request.packing, seed=seed, salt=salt)
        source = _span_examples(file, split, request.data_split, raw_length, lengths, request.packing,
                                (noise_density, mean_noise_span_length))
        rows.append(loader.split_pass(source, f"{file.prefix} ({split})", split, seed).map_with_index(corrupt))
    fingerprint = data_fingerprint([f.prefix for f in files], loaded.sha256, objective="span_corruption",
                                   data_split=request.data_split, blend_weights=request.blend_weights,
                                   packing=request.packing, seed=seed, noise_density=noise_density,
                                   mean_noise_span_length=mean_noise_span_length)
    return combined_source(rows, request, vocab_size=vocab_size, eod_id=loaded.eod_id, tokenizer_path=tokenizer_path,
                           feature_lengths=lengths, fingerprint=fingerprint, data_paths=[f.prefix for f in files])


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
        bounds = np.unique(piece_bounds(file.offsets[first:last + 1], raw_length))  # no empty pieces
        rows = ExampleRows(Pieces(file.tokens, bounds),
                           row_starts(*corrupted_lengths(np.diff(bounds), *spans), lengths, packed=True))
    else:
        rows = ExampleRows(_Windows(file.tokens, start, raw_length), np.arange((end - start) // raw_length + 1))
    if len(rows) == 0:
        raise UserError(f"{file.prefix} ({split}): {end - start} tokens, fewer than one span-corruption example of "
                        f"{raw_length}; lower FEATURE_LENGTHS['inputs'] or give the split more documents")
    return rows


def vocab_size(*, data_path: str | list[str] | None = None, tokenizer: str | None = None) -> int:
    """The tokenizer's ids and the sentinels above them."""
    return vocabulary_with_sentinels(load_tokenizer(tokenizer_of(data_path, tokenizer)))[0]
