"""What T5's objectives (span corruption, seq2seq) share: the sentinels above the vocabulary, the feature
lengths {'inputs': N, 'targets': M}, and rows of (inputs, targets) examples as seqio features:

    encoder_input_tokens [N]  encoder_segment_ids [N] (1 = real, 0 = padding; the examples 1, 2, ... packed)
    decoder_target_tokens [M]  decoder_input_tokens [M]  decoder_loss_weights [M]
    + encoder_positions, decoder_segment_ids, decoder_positions when packing

`decoder_input_tokens` are the targets shifted right with the start id (seqio's 0; a model's own, e.g. CPM-2's
<s>, see features.PairEnds), per example; segment ids number a
row's examples 1, 2, ... (0 = padding) and positions restart at 0 for each."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from t5x_like.data.objectives.common import concatenated
from t5x_like.data.packing import next_fit, walk_rows
from t5x_like.data.tokenizer import Tokenizer
from t5x_like.errors import UserError
from t5x_like.features import DECODER_START_ID


NUM_EXTRA_IDS = 100  # seqio's extra_ids: sentinels <extra_id_0> .. <extra_id_99> above the tokenizer's pieces


PAIR_FIELDS = ("inputs", "targets")


def vocabulary_with_sentinels(tokenizer: Tokenizer) -> tuple[int, int]:
    """(vocab size including the sentinels, number of sentinels); `<extra_id_i>` = vocab size - 1 - i.

    A tokenizer with `<extra_id_*>` pieces must hold them counting down from its last id; one without gets
    NUM_EXTRA_IDS ids above its own (T5's sentencepiece model: 32000 pieces + 100); one that holds its own
    sentinels (`num_sentinels`, CPM-2's vocab.txt) keeps its size."""
    if tokenizer.num_sentinels:
        return tokenizer.vocab_size, tokenizer.num_sentinels
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


def encoder_decoder_lengths(feature_lengths: dict[str, int]) -> dict[str, int]:
    if not isinstance(feature_lengths, dict) or sorted(feature_lengths) != sorted(PAIR_FIELDS) or \
            not all(isinstance(n, int) and n >= 2 for n in feature_lengths.values()):
        raise UserError(f"FEATURE_LENGTHS={feature_lengths!r}: an encoder-decoder objective needs "
                        "{'inputs': N, 'targets': M} with N, M >= 2, e.g. {'inputs': 512, 'targets': 114}")
    return dict(feature_lengths)


def row_features(examples: Sequence[tuple[np.ndarray, np.ndarray]], feature_lengths: dict[str, int],
                 packed: bool, start_id: int = DECODER_START_ID) -> dict[str, np.ndarray]:
    """One row of seqio features from (inputs, targets) examples that together fit `feature_lengths`, the decoder
    reading each example's targets shifted right from `start_id`."""
    encoder = concatenated([inputs for inputs, _ in examples], feature_lengths["inputs"])
    decoder = concatenated([targets for _, targets in examples], feature_lengths["targets"])
    shifted = concatenated([np.concatenate([[start_id], targets[:-1]]) for _, targets in examples],
                            feature_lengths["targets"])
    row = {"encoder_input_tokens": encoder[0], "decoder_target_tokens": decoder[0],
           "decoder_input_tokens": shifted[0], "decoder_loss_weights": (decoder[1] > 0).astype(np.float32),
           "encoder_segment_ids": encoder[1]}  # unpacked: the encoder's padding mask (EOS may be id 0)
    if packed:
        row |= {"encoder_positions": encoder[2], "decoder_segment_ids": decoder[1], "decoder_positions": decoder[2]}
    return row


def row_starts(inputs_lengths: np.ndarray, targets_lengths: np.ndarray, feature_lengths: dict[str, int],
               packed: bool) -> np.ndarray:
    """Where rows start among the examples, plus the end: one example per row, or with packing as many
    consecutive examples as fit both lengths (each fits alone)."""
    if not packed:
        return np.arange(len(inputs_lengths) + 1)
    return walk_rows(np.minimum(next_fit(inputs_lengths, feature_lengths["inputs"]),
                                next_fit(targets_lengths, feature_lengths["targets"])))
