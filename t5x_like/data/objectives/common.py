"""What the objectives share: the request every objective's `make_source` answers (SourceRequest), their
settings checks, the tokenizer of their data, and the pieces rows are made of (examples grouped into rows, tokens
concatenated into padded features, JSONL / TSV records read with the file and line of every mistake)."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import grain
import numpy as np

from t5x_like.data import builtin, loader
from t5x_like.data.loader import GrainBatchSource
from t5x_like.data.passes import PassCounter
from t5x_like.data.rampup import BatchRampup
from t5x_like.data.token_file import TokenFile, TokenFileError, open_token_file
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer
from t5x_like.data.tokenizer_files import recorded_tokenizer_path
from t5x_like.errors import UserError
from t5x_like.features import PairEnds

RECORD_FORMATS = (".jsonl", ".tsv")


@dataclasses.dataclass(frozen=True)
class SourceRequest:
    """What every objective's `make_source(request, *, <its own settings>)` is asked for: this host's
    `batch_size` rows of every global batch of `split` ('train' | 'validation' | 'test'), rows of
    `feature_lengths` (FEATURE_LENGTHS), shuffled and masked from `seed`, this host being `shard_index` of
    `shard_count`; read from `data_path` (DATA_PATH: token-file prefix(es) or record files, a list of them, or a
    dict by split; None: the objective's default), several blended by `blend_weights` (BLEND_WEIGHTS), tokenized
    with `tokenizer` (TOKENIZER), split train/validation/test by `data_split` (DATA_SPLIT), several examples per
    row with `packing` (PACKING), by `worker_count` grain worker processes (0: in this process); the training
    split's batches ramp up as `rampup` says (BATCH_SIZE_RAMPUP; None: every batch whole); `pair_ends(eod_id)`
    says how the model's input/target pairs begin and end (features.PairEnds; None: seqio's)."""

    split: str
    batch_size: int
    feature_lengths: dict[str, int]
    seed: int
    shard_index: int
    shard_count: int
    data_path: str | list[str] | dict | None = None
    blend_weights: list[float] | None = None
    tokenizer: str | None = None
    data_split: str = "949,50,1"
    packing: bool = False
    worker_count: int = 0
    rampup: BatchRampup | None = None
    pair_ends: Callable[[int], PairEnds] | None = None

    def __post_init__(self):
        if self.split not in loader.SPLITS:
            raise UserError(f"split={self.split!r}: expected one of {loader.SPLITS}")
        if self.rampup is not None and self.split != "train":
            raise ValueError(f"a batch-size ramp-up is for the training split, not {self.split!r}")
        if self.batch_size < 1:
            raise UserError(f"batch_size={self.batch_size}: must be positive")


def as_list(data_path: str | list[str]) -> list[str]:
    return [str(data_path)] if isinstance(data_path, (str, Path)) else [str(p) for p in data_path]


def split_paths(data_path, split: str) -> tuple[list[str], bool]:
    """(paths of `split`, whether they belong to it whole) for a path, a list of them or a dict by split."""
    if not isinstance(data_path, dict):
        return as_list(data_path), False
    if split not in data_path:
        raise UserError(f"data_path={data_path!r} names no files for the {split} split; add {split!r}: [...]")
    return as_list(data_path[split]), True


def token_files_vocabulary(files: list[TokenFile], tokenizer: str | None) -> tuple[int, int, str]:
    """(vocab_size, eod_id, tokenizer path) for the files, checking they were made with that tokenizer."""
    if tokenizer is None:
        return vocabulary_from_metadata(files)
    loaded = load_tokenizer(tokenizer)
    for f in files:
        made_with = (f.metadata or {}).get("tokenizer")
        if made_with is not None and made_with["sha256"] != loaded.sha256:
            raise TokenFileError(
                f"{f.prefix}.json: tokenized with {made_with['path']} (sha256 {made_with['sha256'][:12]}…), "
                f"but TOKENIZER={tokenizer} is a different vocabulary (sha256 {loaded.sha256[:12]}…); set "
                "TOKENIZER to the file's tokenizer or re-run preprocess with this one")
    return loaded.vocab_size, loaded.eod_id, tokenizer


def vocabulary_from_metadata(files: list[TokenFile]) -> tuple[int, int, str]:
    for f in files:
        if f.metadata is None:
            raise TokenFileError(f"{f.prefix}: no {f.prefix}.json metadata (a Megatron/NeoX file?); set "
                                 "TOKENIZER (make_source.tokenizer) to the tokenizer it was made with")
    made_with = [f.metadata["tokenizer"] for f in files]
    if len({t["sha256"] for t in made_with}) > 1:
        raise TokenFileError(f"{', '.join(f.prefix for f in files)}: made with different tokenizers "
                             f"({', '.join(t['path'] for t in made_with)}); blend only files of one tokenizer")
    return made_with[0]["vocab_size"], made_with[0]["eod_id"], recorded_tokenizer_path(made_with[0])


def tokenizer_sha256(files: list[TokenFile], tokenizer_path: str) -> str:
    """The sha256 of the files' tokenizer: as their metadata records it, else (Megatron files) TOKENIZER's."""
    recorded = (files[0].metadata or {}).get("tokenizer")
    return recorded["sha256"] if recorded else load_tokenizer(tokenizer_path).sha256


def load_data_tokenizer(path: str, data: str) -> Tokenizer:
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as e:
        raise UserError(f"{data}: tokenizer {path} does not load ({e}); set TOKENIZER to the tokenizer the data "
                        "was made with") from None


def combined_source(rows: list[grain.MapDataset], request: SourceRequest, **batches) -> GrainBatchSource:
    """The request's batches of the files' `rows` blended by its weights (`batches`: the rest of
    loader.batch_source's arguments: vocab_size, eod_id, tokenizer_path, feature_lengths, ...); training's count
    their epochs."""
    combined = loader.combine(rows, request.blend_weights, request.split)
    passes = PassCounter.of(rows, request.blend_weights) if request.split == "train" else None
    return loader.batch_source(combined, batch_size=request.batch_size, shard_index=request.shard_index,
                               shard_count=request.shard_count, worker_count=request.worker_count,
                               rampup=request.rampup, passes=passes, **batches)


def encoder_lengths(feature_lengths: dict[str, int]) -> dict[str, int]:
    if not isinstance(feature_lengths, dict) or set(feature_lengths) != {"inputs"} or \
            not isinstance(feature_lengths["inputs"], int) or feature_lengths["inputs"] < 3:
        raise UserError(f"FEATURE_LENGTHS={feature_lengths!r}: an encoder-only objective needs {{'inputs': N}} "
                        "with N >= 3, e.g. {'inputs': 512}")
    return dict(feature_lengths)


def concatenated(sequences: list[np.ndarray], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens, segment ids, positions) of `sequences` back to back, zero-padded to `length`."""
    lengths = [len(s) for s in sequences]
    used = sum(lengths)
    tokens, segments, positions = (np.zeros(length, np.int32) for _ in range(3))
    tokens[:used] = np.concatenate(sequences)
    segments[:used] = np.repeat(np.arange(1, len(sequences) + 1), lengths)
    positions[:used] = np.concatenate([np.arange(n) for n in lengths])
    return tokens, segments, positions


class ExampleRows:
    """grain data source: row i is the list of examples `example(j)` for j in starts[i] .. starts[i+1]-1."""

    def __init__(self, example, starts: np.ndarray):
        self._example, self._starts = example, starts

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, i: int) -> list:
        return [self._example(j) for j in range(self._starts[i], self._starts[i + 1])]


class Pieces:
    """Example j: tokens[bounds[j]:bounds[j+1]]."""

    def __init__(self, tokens: np.ndarray, bounds: np.ndarray):
        self._tokens, self._bounds = tokens, bounds

    def __call__(self, j: int) -> np.ndarray:
        return np.asarray(self._tokens[self._bounds[j]:self._bounds[j + 1]])


def decoded(raw: bytes, path: str, number: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}:{number}: bytes that are not UTF-8 ({raw[e.start:e.end]!r}); re-encode the "
                        "file as UTF-8") from None


def jsonl_records(path: str, lines: list[tuple[int, str]], fields: str = "fields 'text' and 'label' (and "
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


def tsv_records(path: str, lines: list[tuple[int, str]]) -> list[tuple[int, dict]]:
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


def loaded_token_files(request: SourceRequest) -> tuple[list[TokenFile], str, Tokenizer]:
    """(token files, tokenizer path, the tokenizer loaded) of the request: DATA_PATH's files (the builtin
    corpus without it) and their tokenizer, which TOKENIZER, when given, must be."""
    data_path, tokenizer = request.data_path, request.tokenizer
    if data_path is None:
        data_path, tokenizer = builtin.builtin_corpus()
    files = [open_token_file(p) for p in as_list(data_path)]
    _, _, tokenizer_path = token_files_vocabulary(files, tokenizer)
    return files, tokenizer_path, load_data_tokenizer(tokenizer_path, ", ".join(f.prefix for f in files))


def tokenizer_of(data_path: str | list[str] | None, tokenizer: str | None) -> str:
    """The tokenizer of an objective's token files: TOKENIZER when given, else the one their metadata records
    (the builtin corpus's without DATA_PATH)."""
    if tokenizer is None and data_path is None:
        return builtin.builtin_corpus()[1]
    if tokenizer is None:
        return vocabulary_from_metadata([open_token_file(p) for p in as_list(data_path)])[2]
    return tokenizer
