"""Batches from a TFDS dataset prepared in array_record format, tokenized on the fly (no TensorFlow).

    documents (tfds.data_source) -> shuffle (train) -> repeat -> this host's every shard_count-th document
      -> tokenize: BOS (a tokenizer that has one) + text + EOD (in loader workers when worker_count > 0)
      -> concatenate-then-split into rows of SEQ_LEN+1, or first-fit pack whole documents (longer ones cut)
      -> batch -> the causal-LM features of t5x_like/features.py (loader.window_arrays / packed_arrays)

Unlike token files, rows depend on which documents a host reads, so hosts see different rows than a
single host would; the iterator state still resumes exactly.
"""
from __future__ import annotations

import grain
import grain.experimental
import numpy as np
import tensorflow_datasets as tfds

from t5x_like.data import loader
from t5x_like.errors import UserError
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer


class _Tokenize:
    """Picklable map: a TFDS example -> {'tokens': [BOS] + ids + EOD}, BOS where the tokenizer has one and `add_bos`
    (as preprocess writes documents); loads the tokenizer once per process."""

    def __init__(self, tokenizer_path: str, text_key: str, dataset: str, add_bos: bool):
        self._tokenizer_path, self._text_key, self._dataset = tokenizer_path, text_key, dataset
        self._add_bos = add_bos
        self._tokenizer: Tokenizer | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokenizer": None}

    def __call__(self, example: dict) -> dict[str, np.ndarray]:
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._tokenizer_path)
        if self._text_key not in example:
            raise KeyError(f"TFDS dataset {self._dataset}: no feature {self._text_key!r} (features: "
                           f"{', '.join(example)}); set make_source.text_key")
        text = example[self._text_key]
        text = text.decode("utf-8") if isinstance(text, bytes) else str(text)
        add_bos = self._add_bos and self._tokenizer.bos_id is not None
        ids, _ = self._tokenizer.encode_documents([text], append_eod=True, add_bos=add_bos)
        return {"tokens": ids.astype(np.int32)}


class _Pieces(grain.experimental.FlatMapTransform):
    """Cuts a document longer than a row into row-sized pieces, so first-fit packing never truncates."""

    max_fan_out = 1 << 30  # unused by iterator datasets; grain requires the attribute

    def __init__(self, row_len: int):
        self._row_len = row_len

    def flat_map(self, document: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        tokens = document["tokens"]
        return [{"tokens": tokens[i:i + self._row_len]} for i in range(0, len(tokens), self._row_len)]


def _packed_row(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"tokens": row["tokens"], "segments": row["tokens_segment_ids"], "positions": row["tokens_positions"]}


def make_tfds_source(name: str, split: str, tfds_split: str, *, data_dir: str | None, tokenizer: str | None,
                     text_key: str, batch_size: int, seq_len: int, seed: int, shard_index: int, shard_count: int,
                     packing: bool, worker_count: int, add_bos: bool = True) -> loader.GrainBatchSource:
    """A `BatchSource` for `split` ('train' shuffles) over TFDS dataset `name`'s split `tfds_split`; documents
    start with the tokenizer's BOS when it has one and `add_bos`."""
    if tokenizer is None:
        raise ValueError(f"TFDS dataset {name}: set TOKENIZER (make_source.tokenizer); text is tokenized on the fly")
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"shard_index={shard_index} is not in [0, shard_count={shard_count})")
    loaded = load_tokenizer(tokenizer)
    documents = grain.MapDataset.source(tfds.data_source(name, split=tfds_split, data_dir=data_dir))
    if split == "train":
        documents = documents.shuffle(seed=seed)
    documents = documents.repeat()[shard_index::shard_count].map(_Tokenize(tokenizer, text_key, name, add_bos))
    stream = documents.to_iter_dataset()
    if worker_count > 0:
        loader.ensure_absl_flags_parsed()
        stream = stream.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count))
    length = {"tokens": seq_len + 1}
    if packing:
        pieces = grain.experimental.FlatMapIterDataset(stream, _Pieces(seq_len + 1))
        rows = grain.experimental.FirstFitPackIterDataset(pieces, length_struct=length, num_packing_bins=batch_size,
                                                          shuffle_bins=False).map(_packed_row)
    else:
        rows = grain.experimental.ConcatThenSplitIterDataset(stream, length_struct=length)
    batches = rows.batch(batch_size, drop_remainder=True).map(loader.packed_arrays if packing else loader.window_arrays)

    def from_row(row: int) -> grain.IterDataset:
        if row:
            raise UserError(f"TFDS dataset {name}: a resume with another BATCH_SIZE, host count or SEQ_LEN cannot "
                            "continue a TFDS stream at a row; keep them as the checkpoint's run had them, or set "
                            "--gin.train.restart_data=True to start the data over.")
        return batches

    return loader.GrainBatchSource(from_row, vocab_size=loaded.vocab_size, eod_id=loaded.eod_id,
                                   tokenizer_path=tokenizer, global_batch=batch_size * shard_count,
                                   lengths={"targets": seq_len})
