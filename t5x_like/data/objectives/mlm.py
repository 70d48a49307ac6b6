"""OBJECTIVE = 'mlm': BERT's masked-LM pre-training (FEATURE_LENGTHS {'inputs': N}).

Documents are cut into pieces of at most N - 2 tokens, each a row `[CLS] piece [SEP]` (padded;
encoder_segment_ids 1 / 0) or, packed, several per row (segment ids 1, 2, ..., encoder_positions restarting).
BERT's masking (`mlm_mask`) selects round(15 %) of the non-special tokens, whole words with whole-word masking,
80/10/10 [MASK] / random / kept, drawn from (seed, file, row index in the stream) as span corruption's. Features:
encoder_input_tokens, encoder_segment_ids, encoder_token_types (0), encoder_target_tokens, encoder_loss_weights
(1 where selected)."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from t5x_like.data import loader
from t5x_like.data.fingerprint import data_fingerprint
from t5x_like.data.loader import BatchSource
from t5x_like.data.objectives.common import (ExampleRows, Pieces, SourceRequest, combined_source, concatenated,
                                             encoder_lengths, loaded_token_files, tokenizer_of)
from t5x_like.data.packing import next_fit, piece_bounds, walk_rows
from t5x_like.data.token_file import TokenFile
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer
from t5x_like.errors import UserError
from t5x_like.features import (ENCODER_INPUT_TOKENS, ENCODER_LOSS_WEIGHTS, ENCODER_POSITIONS, ENCODER_SEGMENT_IDS,
                               ENCODER_TARGET_TOKENS, ENCODER_TOKEN_TYPES)


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
    inputs, segments, positions = concatenated([e[1] for e in examples], length)
    targets = concatenated([e[0] for e in examples], length)[0]
    weights = np.zeros(length, np.float32)
    weights[:sum(len(e[2]) for e in examples)] = np.concatenate([e[2] for e in examples])
    inputs[segments == 0] = pad_id
    row = {ENCODER_INPUT_TOKENS: inputs, ENCODER_SEGMENT_IDS: segments, ENCODER_TOKEN_TYPES: np.zeros(length, np.int32),
           ENCODER_TARGET_TOKENS: targets, ENCODER_LOSS_WEIGHTS: weights}
    if packed:
        row[ENCODER_POSITIONS] = positions
    return row


def make_source(request: SourceRequest, *, mask_rate: float = 0.15, whole_word_masking: bool = False) -> BatchSource:
    """Masked-LM batches of the request's split for this host, FEATURE_LENGTHS {'inputs': N}.

    Documents of the token files (the builtin corpus without DATA_PATH) are cut into pieces of at most
    N - 2 tokens; each piece is a row [CLS] piece [SEP] (padded), or with PACKING as many pieces as fit
    go into one row (segment ids 1, 2, ..., positions restarting). `mask_rate` of the non-special tokens
    are selected (80 % [MASK], 10 % random, 10 % kept), whole words at a time with `whole_word_masking`;
    the masks are a pure function of (seed, file, row index in the endless stream): new every epoch,
    the same after a resume."""
    lengths, split, seed = encoder_lengths(request.feature_lengths), request.split, request.seed
    if not 0 < mask_rate < 1:
        raise UserError(f"mask_rate={mask_rate}: the share of tokens masked must be in (0, 1), BERT uses 0.15")
    files, tokenizer_path, loaded = loaded_token_files(request)
    vocab = mlm_vocabulary(loaded)
    starts_word = word_starts(loaded) if whole_word_masking else None
    rows = []
    for salt, file in enumerate(files):
        mask = MaskTokens(vocab=vocab, starts_word=starts_word, rate=mask_rate, length=lengths["inputs"],
                          packed=request.packing, seed=seed, salt=salt)
        source = _mlm_pieces(file, split, request.data_split, lengths["inputs"], request.packing, loaded.eod_id)
        rows.append(loader.split_pass(source, f"{file.prefix} ({split})", split, seed).map_with_index(mask))
    fingerprint = data_fingerprint([f.prefix for f in files], loaded.sha256, objective="mlm",
                                   data_split=request.data_split, blend_weights=request.blend_weights,
                                   packing=request.packing, seed=seed, mask_rate=mask_rate,
                                   whole_word_masking=whole_word_masking)
    return combined_source(rows, request, vocab_size=vocab.vocab_size, eod_id=loaded.eod_id,
                           tokenizer_path=tokenizer_path, feature_lengths=lengths, fingerprint=fingerprint,
                           data_paths=[f.prefix for f in files])


def _mlm_pieces(file: TokenFile, split: str, data_split: str, length: int, packing: bool,
                eod_id: int) -> ExampleRows:
    """Rows of document pieces of at most length - 2 tokens besides the end-of-document id (left out when the
    row is made): one per row, or packed with their [CLS]/[SEP]. A piece that would hold only a document's
    end-of-document id joins the piece before it."""
    first, last = loader.split_documents(data_split, file.num_documents, split, file.prefix)
    bounds = np.unique(piece_bounds(file.offsets[first:last + 1], length - 2))
    lone_eod = (np.diff(bounds) == 1) & (np.asarray(file.tokens[bounds[:-1]]) == eod_id)
    bounds = np.delete(bounds, np.flatnonzero(lone_eod[1:]) + 1)
    sizes = np.diff(bounds) - (np.asarray(file.tokens[bounds[1:] - 1]) == eod_id) + 2
    starts = walk_rows(next_fit(sizes, length)) if packing else np.arange(len(bounds))
    rows = ExampleRows(Pieces(file.tokens, bounds), starts)
    if len(rows) == 0:
        raise UserError(f"{file.prefix} ({split}): no documents in this split; give the split more documents "
                        f"(DATA_SPLIT={data_split!r})")
    return rows


def vocab_size(*, data_path: str | list[str] | None = None, tokenizer: str | None = None) -> int:
    """The tokenizer's ids, and [CLS]/[SEP]/[MASK] above them when it has none."""
    return mlm_vocabulary(load_tokenizer(tokenizer_of(data_path, tokenizer))).vocab_size
