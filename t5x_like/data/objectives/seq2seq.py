"""OBJECTIVE = 'seq2seq': input/target pairs for an encoder-decoder (T5 fine-tuning).

Pairs come from JSONL (one `{"inputs": ..., "targets": ...}` per line) or TSV (a header row naming the `inputs`
and `targets` columns), tokenized when the source is made, or from token files `P.inputs` and `P.targets`
(document i of each is pair i; made by preprocess with --noappend_eod); `fields` names other JSONL fields / TSV
columns (CPM-2-Finetune's LCSTS: ('text', 'summary')). Pairs begin and end as the model's config says
(features.PairEnds, which the trainer passes): T5's are seqio's, each side cut to its length - 1 and EOS appended
(append_eos_after_trim), the targets shifted right from 0; CPM-2's are CPM-2-Finetune's (CPM2Datasets.py): the
encoder reads the input's ids alone, the decoder [<s>, <s_0>, target...] and the labels are
[<s_0>, target..., <s_1>]. The number of pairs cut is logged. One pair per row padded, or with packing as many
consecutive pairs as fit both lengths."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np

from t5x_like.data import loader
from t5x_like.data.fingerprint import data_fingerprint
from t5x_like.data.loader import BatchSource
from t5x_like.data.objectives.common import (RECORD_FORMATS, ExampleRows, SourceRequest, as_list, combined_source,
                                             decoded, jsonl_records, load_data_tokenizer, split_paths,
                                             token_files_vocabulary, tsv_records)
from t5x_like.data.objectives.encoder_decoder import (PAIR_FIELDS, encoder_decoder_lengths, row_features, row_starts,
                                                      vocabulary_with_sentinels)
from t5x_like.data.token_file import TokenFile, open_token_file, token_dtype
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer
from t5x_like.errors import UserError
from t5x_like.features import PairEnds


class _Pairs:
    """Example j: (document first+j of `inputs`, the same of `targets`)."""

    def __init__(self, inputs: TokenFile, targets: TokenFile, first: int):
        self._inputs, self._targets, self._first = inputs, targets, first

    def __call__(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        return self._inputs.document(self._first + j), self._targets.document(self._first + j)


class TrimPairs:
    """map: a row's raw (inputs, targets) pairs -> seqio features, each side cut to fit its length with the ids
    `ends` adds (T5: EOS after each; CPM-2: <s_0> before the target and <s_1> after it)."""

    def __init__(self, *, ends: PairEnds, feature_lengths: dict[str, int], packed: bool):
        self._ends, self._feature_lengths, self._packed = ends, feature_lengths, packed

    def __call__(self, pairs: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, np.ndarray]:
        lengths, ends = self._feature_lengths, self._ends
        trimmed = [(np.asarray(ends.inputs(inputs, lengths["inputs"]), inputs.dtype),
                    np.asarray(ends.targets(targets, lengths["targets"]), targets.dtype)) for inputs, targets in pairs]
        return row_features(trimmed, lengths, self._packed, start_id=ends.start_ids[0])


def make_source(request: SourceRequest, *, fields: tuple[str, str] = PAIR_FIELDS) -> BatchSource:
    """Batches of input/target pairs of the request's split for this host.

    DATA_PATH: a `.jsonl` / `.tsv` file of pairs (tokenized with TOKENIZER, then required) or the prefix P of
    token files `P.inputs` + `P.targets`; several are blended by BLEND_WEIGHTS. Each is split into
    train/validation/test by pair with DATA_SPLIT, unless DATA_PATH is a dict naming each split's files,
    e.g. {'train': 'train.jsonl', 'validation': 'dev.jsonl'}. PACKING packs several pairs per row. `fields`:
    the (inputs, targets) JSONL fields / TSV columns."""
    lengths, split, data_path, tokenizer = (encoder_decoder_lengths(request.feature_lengths), request.split,
                                            request.data_path, request.tokenizer)
    if data_path is None:
        raise UserError("OBJECTIVE='seq2seq' needs DATA_PATH: a .jsonl / .tsv file of input/target pairs, token "
                        "files P.inputs + P.targets, or a dict of them per split.")
    paths, whole = split_paths(data_path, split)
    token_files = {p: _open_pair_files(p) for p in paths if not p.endswith(RECORD_FORMATS)}
    if tokenizer is None and not token_files:
        raise UserError(f"data_path={data_path!r}: set TOKENIZER (make_source.tokenizer) to tokenize the "
                        "pairs with")
    if token_files:
        _, _, tokenizer = token_files_vocabulary([f for pair in token_files.values() for f in pair], tokenizer)
    loaded = load_data_tokenizer(tokenizer, ", ".join(paths))
    vocab_size, _ = vocabulary_with_sentinels(loaded)
    ends = request.pair_ends(loaded.eod_id) if request.pair_ends else PairEnds.seqio(loaded.eod_id)
    trim = TrimPairs(ends=ends, feature_lengths=lengths, packed=request.packing)
    data_split = None if whole else request.data_split
    rows = []
    for path in paths:
        inputs, targets = token_files[path] if path in token_files else _tokenized_pairs(path, loaded, fields)
        source = _pair_examples(inputs, targets, path, split, data_split, lengths, request.packing, ends)
        rows.append(loader.split_pass(source, f"{path} ({split})", split, request.seed).map(trim))
    files = [f"{p}.{side}" for p in paths if p in token_files for side in ("inputs", "targets")] + \
        [p for p in paths if p not in token_files]
    fingerprint = data_fingerprint(files, loaded.sha256, objective="seq2seq", data_split=data_split,
                                   blend_weights=request.blend_weights, packing=request.packing, seed=request.seed,
                                   **({} if ends == PairEnds.seqio(loaded.eod_id) else
                                      {"pair_ends": dataclasses.asdict(ends) | {"start_ids": list(ends.start_ids)}}))
    return combined_source(rows, request, vocab_size=vocab_size, eod_id=loaded.eod_id, tokenizer_path=tokenizer,
                           feature_lengths=lengths, fingerprint=fingerprint, data_paths=files)


def _pair_examples(inputs: TokenFile, targets: TokenFile, path: str, split: str, data_split: str | None,
                   lengths: dict[str, int], packing: bool, ends: PairEnds) -> ExampleRows:
    """Rows of raw pairs of `split` (all pairs when `data_split` is None); logs how many get cut."""
    first, last = (0, inputs.num_documents) if data_split is None else \
        loader.split_documents(data_split, inputs.num_documents, split, path)
    inputs_lengths = np.diff(inputs.offsets[first:last + 1]) + ends.added_inputs
    targets_lengths = np.diff(targets.offsets[first:last + 1]) + ends.added_targets
    logging.info("data: %s (%s): %d pairs; %d inputs longer than %d and %d targets longer than %d tokens are cut "
                 "(FEATURE_LENGTHS, the ids the model adds included)", path, split, last - first,
                 np.sum(inputs_lengths > lengths["inputs"]), lengths["inputs"],
                 np.sum(targets_lengths > lengths["targets"]), lengths["targets"])
    starts = row_starts(np.minimum(inputs_lengths, lengths["inputs"]),
                        np.minimum(targets_lengths, lengths["targets"]), lengths, packing)
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


def _tokenized_pairs(path: str, tokenizer: Tokenizer, fields: tuple[str, str]) -> tuple[TokenFile, TokenFile]:
    """The pairs of a JSONL / TSV file tokenized into in-memory token files (inputs, targets)."""
    pairs = read_pairs(path, fields)
    sides = []
    for field, texts in zip(fields, zip(*pairs)):
        ids, counts = tokenizer.encode_documents(texts, append_eod=False)
        offsets = np.concatenate([[0], np.cumsum(counts)])
        sides.append(TokenFile(f"{path} ({field})", ids.astype(token_dtype(tokenizer.vocab_size)), offsets, None))
    return sides[0], sides[1]


def read_pairs(path: str, fields: tuple[str, str] = PAIR_FIELDS) -> list[tuple[str, str]]:
    """The (inputs, targets) strings of a JSONL or TSV file (`fields`: their fields / columns); bad lines raise
    UserError naming file and line."""
    if not path.endswith(RECORD_FORMATS):
        raise UserError(f"{path}: pairs must be in a file named *.jsonl or *.tsv")
    with open(path, "rb") as f:
        lines = [(number, decoded(raw, path, number)) for number, raw in enumerate(f, 1)]
    lines = [(number, line.rstrip("\r\n")) for number, line in lines if line.strip()]
    fields = _checked_fields(fields)
    pairs = _jsonl_pairs(path, lines, fields) if path.endswith(".jsonl") else _tsv_pairs(path, lines, fields)
    if not pairs:
        raise UserError(f"{path}: no pairs (an empty file?)")
    return pairs


def _checked_fields(fields) -> tuple[str, str]:
    if not isinstance(fields, (list, tuple)) or len(fields) != 2 or not all(isinstance(f, str) for f in fields):
        raise UserError(f"data.make_source.fields={fields!r}: expected the (inputs, targets) field names, e.g. "
                        "('text', 'summary')")
    return tuple(fields)


def _jsonl_pairs(path: str, lines: list[tuple[int, str]], fields: tuple[str, str]) -> list[tuple[str, str]]:
    records = jsonl_records(path, lines, f"fields {fields[0]!r} and {fields[1]!r}")
    return [tuple(_field(value, field, path, number, fields) for field in fields) for number, value in records]


def _field(value: dict, field: str, path: str, number: int, fields: tuple[str, str]) -> str:
    if field not in value:
        raise UserError(f"{path}:{number}: no field {field!r} (fields: {', '.join(value) or 'none'}); each line "
                        f"needs string fields {fields[0]!r} and {fields[1]!r}")
    if not isinstance(value[field], str):
        raise UserError(f"{path}:{number}: field {field!r} is {type(value[field]).__name__}, expected a string")
    return _nonempty(value[field], field, path, number)


def _nonempty(text: str, field: str, path: str, number: int) -> str:
    if not text.strip():
        raise UserError(f"{path}:{number}: an empty {field!r}; every pair needs text on both sides (remove the "
                        "line or fill it in)")
    return text


def _tsv_pairs(path: str, lines: list[tuple[int, str]], fields: tuple[str, str]) -> list[tuple[str, str]]:
    if not lines:
        return []
    header = lines[0][1].split("\t")
    missing = [field for field in fields if field not in header]
    if missing:
        raise UserError(f"{path}:{lines[0][0]}: the header row names no column {missing[0]!r} (columns: "
                        f"{', '.join(header)}); the first row must name the {fields[0]!r} and {fields[1]!r} columns")
    return [tuple(_nonempty(record[field], field, path, number) for field in fields)
            for number, record in tsv_records(path, lines)]


def vocab_size(*, data_path: str | list[str] | dict, tokenizer: str | None = None) -> int:
    """The tokenizer's ids and the sentinels above them (the pair token files' tokenizer without TOKENIZER)."""
    if tokenizer is None:
        paths = [p for split in (data_path.values() if isinstance(data_path, dict) else [data_path])
                 for p in as_list(split) if not p.endswith(RECORD_FORMATS)]
        if not paths:
            raise UserError(f"data_path={data_path!r}: set TOKENIZER to tokenize the pairs with")
        tokenizer = token_files_vocabulary([f for p in paths for f in _open_pair_files(p)], None)[2]
    return vocabulary_with_sentinels(load_tokenizer(tokenizer))[0]
