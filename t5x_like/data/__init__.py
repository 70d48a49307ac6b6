"""Data: tokenizers, corpus preprocessing, token files and the batch sources the trainer iterates.

    source = make_source('train', batch_size=8, seq_len=1024, seed=0, shard_index=0, shard_count=1)
    batch = next(source)   # {'inputs', 'targets', 'weights'} (+ 'segment_ids', 'positions' when packing)
"""
from t5x_like.data.builtin import BUILTIN_VOCAB_SIZE
from t5x_like.data.loader import BatchSource
from t5x_like.data.sources import make_source
from t5x_like.data.token_file import open_token_file
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer

__all__ = ["BUILTIN_VOCAB_SIZE", "BatchSource", "Tokenizer", "load_tokenizer", "make_source", "open_token_file"]
