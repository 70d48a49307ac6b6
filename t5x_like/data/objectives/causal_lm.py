"""OBJECTIVE = 'causal_lm': next-token prediction for a decoder-only model (GPT-2, GPT-NeoX, CPM, ...), rows of
FEATURE_LENGTHS {'targets': T} tokens (t5x_like/data/loader.py: windows of the documents, or packed).

Data, in order of precedence:
  - `tfds_name`: a TFDS dataset prepared as array_record under `tfds_data_dir`; its split of the same name, or
    `tfds_splits[split]` (e.g. {'train': 'train[:99%]', 'validation': 'train[99%:]'}); documents from feature
    `text_key`, tokenized on the fly with `tokenizer` (required), each document after the tokenizer's BOS when it
    has one (a Llama tokenizer.json; as preprocess writes them) unless `add_bos` is False;
  - `data_path`: token-file prefix(es) (ours or Megatron/NeoX), split into train/validation/test by document with
    `data_split`, several blended by `blend_weights`; `tokenizer`, when given, must be the one the files were made
    with (it is required for Megatron files, which carry no metadata);
  - neither: the builtin corpus (Python's documentation, tokenized with its own 8192-id BPE).
"""
from __future__ import annotations

import logging

from t5x_like.data import builtin, loader
from t5x_like.data.fingerprint import data_fingerprint
from t5x_like.data.loader import BatchSource
from t5x_like.data.objectives.common import (SourceRequest, as_list, combined_source, token_files_vocabulary,
                                             tokenizer_sha256, vocabulary_from_metadata)
from t5x_like.data.token_file import TokenFile, check_ids, open_token_file
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.errors import UserError
from t5x_like.features import decoder_only_length


def make_source(request: SourceRequest, *, tfds_name: str | None = None, tfds_data_dir: str | None = None,
                tfds_splits: dict[str, str] | None = None, text_key: str = "text", add_bos: bool = True) -> BatchSource:
    """Causal-LM batches of the request's split for this host."""
    seq_len, split, packing = decoder_only_length(request.feature_lengths), request.split, request.packing
    if seq_len < 1:
        raise UserError(f"seq_len={seq_len}: must be positive")
    if tfds_name is not None:
        if request.rampup is not None:
            raise UserError(f"BATCH_SIZE_RAMPUP: the TFDS stream {tfds_name} is read in order and cannot give a "
                            "ramp-up step its rows; train on token files (DATA_PATH), or set BATCH_SIZE_RAMPUP=None.")
        from t5x_like.data import tfds_source  # tensorflow_datasets is heavy: import only when used
        return tfds_source.make_tfds_source(
            tfds_name, split, (tfds_splits or {}).get(split, split), data_dir=tfds_data_dir,
            tokenizer=request.tokenizer, text_key=text_key, batch_size=request.batch_size, seq_len=seq_len,
            seed=request.seed, shard_index=request.shard_index, shard_count=request.shard_count, packing=packing,
            worker_count=request.worker_count, add_bos=add_bos)
    data_path, tokenizer = request.data_path, request.tokenizer
    if data_path is None:
        data_path, tokenizer = builtin.builtin_corpus()
    prefixes, data_split, blend_weights = as_list(data_path), request.data_split, request.blend_weights
    files = [open_token_file(p) for p in prefixes]
    vocab_size, eod_id, tokenizer_path = token_files_vocabulary(files, tokenizer)
    for f in files:
        check_ids(f, vocab_size, tokenizer_path)
    passes = [loader.split_rows(f, split, data_split=data_split, seq_len=seq_len, packing=packing) for f in files]
    logging.info("data: %s split (DATA_SPLIT=%s, SEQ_LEN=%d%s)\n%s", split, data_split, seq_len,
                 ", packed" if packing else "", split_table(files, passes, split, data_split, blend_weights))
    rows = [loader.split_pass(p, f"{f.prefix} ({split})", split, request.seed) for f, p in zip(files, passes)]
    fingerprint = data_fingerprint(prefixes, tokenizer_sha256(files, tokenizer_path), objective="causal_lm",
                                   data_split=data_split, blend_weights=blend_weights, packing=packing,
                                   seed=request.seed)
    return combined_source(rows, request, vocab_size=vocab_size, eod_id=eod_id, tokenizer_path=tokenizer_path,
                           feature_lengths=dict(request.feature_lengths), fingerprint=fingerprint,
                           data_paths=prefixes, arrays=loader.packed_arrays if packing else loader.window_arrays)


def vocab_size(*, data_path: str | list[str] | None = None, tokenizer: str | None = None,
               tfds_name: str | None = None) -> int:
    """The tokenizer's ids (TOKENIZER's, or the one the token files record)."""
    if tokenizer is not None:
        return load_tokenizer(tokenizer).vocab_size
    if tfds_name is not None:
        raise UserError(f"tfds_name={tfds_name!r} needs a tokenizer: set TOKENIZER (make_source.tokenizer)")
    if data_path is None:
        return builtin.BUILTIN_VOCAB_SIZE
    return vocabulary_from_metadata([open_token_file(p) for p in as_list(data_path)])[0]


def split_table(files: list[TokenFile], passes: list, split: str, data_split: str,
                weights: list[float] | None) -> str:
    """Megatron's dataset summary for one split: documents, tokens and rows per blended source."""
    weights = list(weights) if weights is not None else [1.0] * len(files)
    lines = [f"{'source':<40} {'weight':>7} {'documents':>12} {'tokens':>15} {'rows':>12}"]
    for f, rows, w in zip(files, passes, weights):
        first, last = loader.split_documents(data_split, f.num_documents, split, f.prefix)
        tokens = int(f.offsets[last] - f.offsets[first])
        lines.append(f"{f.prefix[-40:]:<40} {w / sum(weights):>7.3f} {last - first:>12,} {tokens:>15,} "
                     f"{len(rows):>12,}")
    return "\n".join(lines)
