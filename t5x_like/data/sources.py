"""`make_source`: the one entry point the trainer and eval tools call for batches, for every objective."""
from __future__ import annotations

import logging

from t5x_like.data import builtin, loader
from t5x_like.data.fingerprint import data_fingerprint
from t5x_like.errors import UserError
from t5x_like.data.loader import BatchSource
from t5x_like.data.token_file import TokenFile, TokenFileError, check_ids, open_token_file
from t5x_like.data.tokenizer import load_tokenizer, recorded_tokenizer_path
from t5x_like.features import decoder_only_length


OBJECTIVES = ("causal_lm", "span_corruption", "seq2seq", "mlm", "classification")


def make_source(split: str, *, batch_size: int, feature_lengths: dict[str, int], seed: int, shard_index: int,
                shard_count: int,
                objective: str = "causal_lm",
                data_path: str | list[str] | None = None,
                blend_weights: list[float] | None = None,
                tokenizer: str | None = None,
                data_split: str = "949,50,1",
                packing: bool = False,
                tfds_name: str | None = None,
                tfds_data_dir: str | None = None,
                tfds_splits: dict[str, str] | None = None,
                text_key: str = "text",
                worker_count: int = 0,
                noise_density: float = 0.15,
                mean_noise_span_length: float = 3.0,
                mask_rate: float = 0.15,
                whole_word_masking: bool = False,
                labels: list[str] | None = None) -> BatchSource:
    """Causal-LM batches of `split` ('train' | 'validation' | 'test') for this host (`batch_size` rows of
    it), rows of FEATURE_LENGTHS {'targets': T} tokens (t5x_like/features.py names the arrays).

    Data, in order of precedence:
      - `tfds_name`: a TFDS dataset prepared as array_record under `tfds_data_dir`; its split of the same
        name, or `tfds_splits[split]` (e.g. {'train': 'train[:99%]', 'validation': 'train[99%:]'});
        documents from feature `text_key`, tokenized on the fly with `tokenizer` (required);
      - `data_path`: token-file prefix(es) (ours or Megatron/NeoX), split into train/validation/test by
        document with `data_split`, several blended by `blend_weights`; `tokenizer`, when given, must be
        the one the files were made with (it is required for Megatron files, which carry no metadata);
      - neither: the builtin corpus (Python's documentation, tokenized with its own 8192-id BPE).
    `packing` packs whole documents per row with segment_ids/positions; `worker_count` > 0 prepares
    batches in that many processes.

    `objective` (OBJECTIVE): 'causal_lm' (above), or T5's 'span_corruption' (noise_density,
    mean_noise_span_length; {'inputs': I, 'targets': T}) and 'seq2seq' input/target pairs (data_path: a
    .jsonl / .tsv file, token files P.inputs + P.targets, or a dict of them per split), both in
    t5x_like/data/objectives.py with the same data_path / tokenizer / split / blend / packing settings;
    and for encoder-only models (FEATURE_LENGTHS {'inputs': N}) BERT's masked-LM 'mlm' over token files
    (mask_rate, whole_word_masking), and 'classification' of labelled text (data_path: a .jsonl / .tsv of
    text, text_pair, label, or a dict of them per split; `labels`: the label list).
    """
    if objective not in OBJECTIVES:
        raise UserError(f"OBJECTIVE={objective!r} is unknown; choose one of {OBJECTIVES}.")
    if objective != "causal_lm":
        if tfds_name is not None:
            raise UserError(f"OBJECTIVE={objective!r} reads token files or pair files; tfds_name works with "
                            "'causal_lm' only (preprocess the TFDS text into a token file instead).")
        from t5x_like.data import objectives

        common = dict(batch_size=batch_size, feature_lengths=feature_lengths, seed=seed, shard_index=shard_index,
                      shard_count=shard_count, data_path=data_path, blend_weights=blend_weights, tokenizer=tokenizer,
                      data_split=data_split, packing=packing, worker_count=worker_count)
        if objective == "mlm":
            return objectives.make_mlm_source(split, mask_rate=mask_rate, whole_word_masking=whole_word_masking,
                                              **common)
        if objective == "classification":
            if data_path is None:
                raise UserError("OBJECTIVE='classification' needs DATA_PATH: a .jsonl / .tsv of text, text_pair "
                                "and label (or BoolQ's question, passage, label), or a dict of them per split.")
            return objectives.make_classification_source(split, labels=labels, **common)
        if objective == "span_corruption":
            return objectives.make_span_corruption_source(
                split, noise_density=noise_density, mean_noise_span_length=mean_noise_span_length, **common)
        if data_path is None:
            raise UserError("OBJECTIVE='seq2seq' needs DATA_PATH: a .jsonl / .tsv file of input/target pairs, "
                            "token files P.inputs + P.targets, or a dict of them per split.")
        return objectives.make_seq2seq_source(split, **common)
    seq_len = decoder_only_length(feature_lengths)
    if split not in loader.SPLITS:
        raise UserError(f"split={split!r}: expected one of {loader.SPLITS}")
    if batch_size < 1 or seq_len < 1:
        raise UserError(f"batch_size={batch_size}, seq_len={seq_len}: both must be positive")
    if tfds_name is not None:
        from t5x_like.data import tfds_source  # tensorflow_datasets is heavy: import only when used
        return tfds_source.make_tfds_source(
            tfds_name, split, (tfds_splits or {}).get(split, split), data_dir=tfds_data_dir, tokenizer=tokenizer,
            text_key=text_key, batch_size=batch_size, seq_len=seq_len, seed=seed, shard_index=shard_index,
            shard_count=shard_count, packing=packing, worker_count=worker_count)
    if data_path is None:
        data_path, tokenizer = builtin.builtin_corpus()
    prefixes = [data_path] if isinstance(data_path, str) else list(data_path)
    files = [open_token_file(p) for p in prefixes]
    vocab_size, eod_id, tokenizer_path = token_files_vocabulary(files, tokenizer)
    for f in files:
        check_ids(f, vocab_size, tokenizer_path)
    passes = [loader.split_rows(f, split, data_split=data_split, seq_len=seq_len, packing=packing) for f in files]
    logging.info("data: %s split (DATA_SPLIT=%s, SEQ_LEN=%d%s)\n%s", split, data_split, seq_len,
                 ", packed" if packing else "", split_table(files, passes, split, data_split, blend_weights))
    rows = [loader.split_pass(p, f"{f.prefix} ({split})", split, seed) for f, p in zip(files, passes)]
    fingerprint = data_fingerprint(prefixes, tokenizer_sha256(files, tokenizer_path), objective="causal_lm",
                                   data_split=data_split, blend_weights=blend_weights, packing=packing, seed=seed)
    return loader.batch_source(loader.combine(rows, blend_weights, split), batch_size=batch_size,
                               shard_index=shard_index, shard_count=shard_count, worker_count=worker_count,
                               vocab_size=vocab_size, eod_id=eod_id, tokenizer_path=tokenizer_path,
                               feature_lengths=dict(feature_lengths), fingerprint=fingerprint, data_paths=prefixes,
                               arrays=loader.packed_arrays if packing else loader.window_arrays)


def tokenizer_sha256(files: list[TokenFile], tokenizer_path: str) -> str:
    """The sha256 of the files' tokenizer: as their metadata records it, else (Megatron files) TOKENIZER's."""
    recorded = (files[0].metadata or {}).get("tokenizer")
    return recorded["sha256"] if recorded else load_tokenizer(tokenizer_path).sha256


def tokenizer_vocab_size(*, data_path: str | list[str] | None = None, tokenizer: str | None = None,
                         tfds_name: str | None = None, objective: str = "causal_lm") -> int:
    """The vocabulary size of `make_source`'s batches for these arguments, without reading any batch.
    T5's objectives add the sentinels to the tokenizer's ids (objectives.vocabulary_with_sentinels), masked-LM
    its [CLS]/[SEP]/[MASK] where the tokenizer has none (objectives.mlm_vocabulary)."""
    if objective == "classification" and tokenizer is None:
        raise UserError("OBJECTIVE='classification' needs TOKENIZER: the tokenizer (vocab.txt, tokenizer.json) "
                        "the labelled text is tokenized with.")
    if objective in ("span_corruption", "seq2seq", "mlm", "classification") and tfds_name is None:
        from t5x_like.data import objectives  # it imports this module
        if tokenizer is None and data_path is None:
            tokenizer = builtin.builtin_corpus()[1]
        elif tokenizer is None:
            prefixes = [data_path] if isinstance(data_path, str) else list(data_path)
            tokenizer = _vocabulary_from_metadata([open_token_file(p) for p in prefixes])[2]
        if objective in ("mlm", "classification"):
            return objectives.mlm_vocabulary(load_tokenizer(tokenizer)).vocab_size
        return objectives.vocabulary_with_sentinels(load_tokenizer(tokenizer))[0]
    if tokenizer is not None:
        return load_tokenizer(tokenizer).vocab_size
    if tfds_name is not None:
        raise UserError(f"tfds_name={tfds_name!r} needs a tokenizer: set TOKENIZER (make_source.tokenizer)")
    if data_path is None:
        return builtin.BUILTIN_VOCAB_SIZE
    prefixes = [data_path] if isinstance(data_path, str) else list(data_path)
    return _vocabulary_from_metadata([open_token_file(p) for p in prefixes])[0]
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


def token_files_vocabulary(files: list[TokenFile], tokenizer: str | None) -> tuple[int, int, str]:
    """(vocab_size, eod_id, tokenizer path) for the files, checking they were made with that tokenizer."""
    if tokenizer is None:
        return _vocabulary_from_metadata(files)
    loaded = load_tokenizer(tokenizer)
    for f in files:
        made_with = (f.metadata or {}).get("tokenizer")
        if made_with is not None and made_with["sha256"] != loaded.sha256:
            raise TokenFileError(
                f"{f.prefix}.json: tokenized with {made_with['path']} (sha256 {made_with['sha256'][:12]}…), "
                f"but TOKENIZER={tokenizer} is a different vocabulary (sha256 {loaded.sha256[:12]}…); set "
                "TOKENIZER to the file's tokenizer or re-run preprocess with this one")
    return loaded.vocab_size, loaded.eod_id, tokenizer


def _vocabulary_from_metadata(files: list[TokenFile]) -> tuple[int, int, str]:
    for f in files:
        if f.metadata is None:
            raise TokenFileError(f"{f.prefix}: no {f.prefix}.json metadata (a Megatron/NeoX file?); set "
                                 "TOKENIZER (make_source.tokenizer) to the tokenizer it was made with")
    made_with = [f.metadata["tokenizer"] for f in files]
    if len({t["sha256"] for t in made_with}) > 1:
        raise TokenFileError(f"{', '.join(f.prefix for f in files)}: made with different tokenizers "
                             f"({', '.join(t['path'] for t in made_with)}); blend only files of one tokenizer")
    return made_with[0]["vocab_size"], made_with[0]["eod_id"], recorded_tokenizer_path(made_with[0])
