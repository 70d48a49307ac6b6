"""OBJECTIVE = 'classification': labelled text for an encoder-only model (BERT, RoBERTa fine-tuning).

Examples come from JSONL / TSV (`text`, optional `text_pair`, `label`; BoolQ's `question`, `passage`, `label`),
one per row `[CLS] text [SEP] text_pair [SEP]` (token types 0 / 1; RoBERTa's `<s> text </s></s> text_pair </s>`),
cut longest-first; classification_labels [1] is the label's index in the label list."""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from t5x_like.data import loader
from t5x_like.data.fingerprint import data_fingerprint
from t5x_like.data.loader import BatchSource
from t5x_like.data.objectives.common import (RECORD_FORMATS, SourceRequest, combined_source, decoded, encoder_lengths,
                                             jsonl_records, load_data_tokenizer, split_paths, tsv_records)
from t5x_like.data.objectives.mlm import MLM_SPECIAL_TOKENS, MLMVocabulary, mlm_vocabulary
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer
from t5x_like.errors import UserError
from t5x_like.features import CLASSIFICATION_LABELS, ENCODER_INPUT_TOKENS, ENCODER_SEGMENT_IDS, ENCODER_TOKEN_TYPES


@dataclasses.dataclass(frozen=True)
class LabelledText:
    text: str
    text_pair: str | None
    label: str


def read_labelled(path: str) -> list[LabelledText]:
    """The examples of a JSONL (`text`, optional `text_pair`, `label`; or BoolQ's `question`, `passage`,
    `label`) or TSV file (a header row naming those columns). Labels are kept as strings (JSON true/false
    -> 'True'/'False', integers -> '0', '1', ...); bad lines raise UserError naming file and line."""
    if not path.endswith(RECORD_FORMATS):
        raise UserError(f"{path}: classification examples must be in a file named *.jsonl or *.tsv")
    with open(path, "rb") as f:
        lines = [(number, decoded(raw, path, number).rstrip("\r\n")) for number, raw in enumerate(f, 1)]
    lines = [(number, line) for number, line in lines if line.strip()]
    rows = jsonl_records(path, lines) if path.endswith(".jsonl") else tsv_records(path, lines)
    examples = [_labelled(record, path, number) for number, record in rows]
    if not examples:
        raise UserError(f"{path}: no examples (an empty file?)")
    return examples


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


def encode_pair(tokens: np.ndarray, pair: np.ndarray | None, vocab: MLMVocabulary, double_separator: bool,
                length: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, token types) of [CLS] text [SEP] (pair [SEP]) cut longest-first to `length`; with `double_separator`
    (a vocabulary spelling them <s> / </s>, as RoBERTa's BPE) <s> text </s></s> pair </s>, of one token type."""
    separators = 1 if pair is None else (4 if double_separator else 3)
    a, b = list(tokens), [] if pair is None else list(pair)
    while len(a) + len(b) + separators > length:
        (a if len(a) >= len(b) else b).pop()
    ids = [vocab.cls_id, *a, vocab.sep_id]
    types = [0] * len(ids)
    if pair is not None:
        second = ([vocab.sep_id] if double_separator else []) + b + [vocab.sep_id]
        ids += second
        types += [0 if double_separator else 1] * len(second)
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
    double_separator = tokenizer.token_to_id(MLM_SPECIAL_TOKENS[1][0]) is not None
    texts = tokenizer.encode_batch([e.text for e in examples])
    pairs = tokenizer.encode_batch([e.text_pair or "" for e in examples])
    ids = [encode_pair(np.array(t), np.array(p) if e.text_pair is not None else None, vocab, double_separator, length)
           for t, p, e in zip(texts, pairs, examples)]
    return ids, label_ids(examples, labels, path), labels


def make_source(request: SourceRequest, *, labels: Sequence[str] | None = None) -> BatchSource:
    """Classification batches of the request's split for this host: one example per row, [CLS] text [SEP]
    (text_pair [SEP]) padded to FEATURE_LENGTHS['inputs'] with token types, and its label's index in `labels`
    (the label list; by default 'False'/'True', 0..max or the sorted labels of each file). DATA_PATH: a .jsonl
    / .tsv file split by example with DATA_SPLIT, or a dict naming each split's files."""
    lengths, split, data_path, tokenizer = (encoder_lengths(request.feature_lengths), request.split,
                                            request.data_path, request.tokenizer)
    if data_path is None:
        raise UserError("OBJECTIVE='classification' needs DATA_PATH: a .jsonl / .tsv of text, text_pair and label "
                        "(or BoolQ's question, passage, label), or a dict of them per split.")
    if request.packing:
        raise UserError("OBJECTIVE='classification' takes one example per row; set PACKING=False")
    if tokenizer is None:
        raise UserError(f"data_path={data_path!r}: set TOKENIZER (make_source.tokenizer) to tokenize the examples "
                        "with (the pre-trained model's vocab.txt or tokenizer.json)")
    paths, whole = split_paths(data_path, split)
    loaded = load_data_tokenizer(tokenizer, ", ".join(paths))
    data_split = None if whole else request.data_split
    rows = []
    for path in paths:
        ids, label_index, _ = classification_examples(path, loaded, labels, lengths["inputs"])
        first, last = (0, len(ids)) if whole else loader.split_documents(data_split, len(ids), split, path)
        source = ClassificationRows(ids[first:last], label_index[first:last], lengths["inputs"],
                                    mlm_vocabulary(loaded).pad_id)
        rows.append(loader.split_pass(source, f"{path} ({split})", split, request.seed))
    fingerprint = data_fingerprint(paths, loaded.sha256, objective="classification", data_split=data_split,
                                   blend_weights=request.blend_weights, seed=request.seed, labels=labels)
    return combined_source(rows, request, vocab_size=mlm_vocabulary(loaded).vocab_size, eod_id=loaded.eod_id,
                           tokenizer_path=tokenizer, feature_lengths=lengths, fingerprint=fingerprint,
                           data_paths=paths)


def vocab_size(*, data_path=None, tokenizer: str | None = None) -> int:
    """The tokenizer's ids, and [CLS]/[SEP]/[MASK] above them when it has none."""
    if tokenizer is None:
        raise UserError("OBJECTIVE='classification' needs TOKENIZER: the tokenizer (vocab.txt, tokenizer.json) "
                        "the labelled text is tokenized with.")
    return mlm_vocabulary(load_tokenizer(tokenizer)).vocab_size
