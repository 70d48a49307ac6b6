"""Data: tokenizers, corpus preprocessing, token files and the batch sources the trainer iterates.

    source = make_source('train', SourceSettings(data_path='data/owt_gpt2'), batch_size=8,
                         feature_lengths={'targets': 1024}, seed=0, shard_index=0, shard_count=1)
    batch = next(source)   # t5x_like/features.py: decoder_input_tokens, decoder_target_tokens, ...

SourceSettings' `objective` picks what the rows hold (t5x_like/data/objectives/: causal_lm, span_corruption, seq2seq, mlm,
classification), each with its FEATURE_LENGTHS, e.g. {'inputs': 512, 'targets': 114} for span corruption.

Names are imported on first use, so the preprocessing CLI and its worker processes start without grain.
"""
import importlib

_EXPORTS = {
    "BUILTIN_VOCAB_SIZE": "t5x_like.data.builtin",
    "BatchSource": "t5x_like.data.loader",
    "check_model_vocabulary": "t5x_like.data.sources",
    "make_source": "t5x_like.data.sources",
    "SourceSettings": "t5x_like.data.sources",
    "open_token_file": "t5x_like.data.token_file",
    "Tokenizer": "t5x_like.data.tokenizer",
    "load_tokenizer": "t5x_like.data.tokenizer",
    "tokenizer_record": "t5x_like.data.tokenizer_files",
    "tokenizer_vocab_size": "t5x_like.data.sources",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
