"""T5 <-> Hugging Face `T5ForConditionalGeneration`: a name map plus three transforms.

What differs from ours:
  - HF linear weights are [out, in]; ours are [in, ...] with the heads split out: q/k/v
    [embed, heads, d_kv] <-> [heads*d_kv, embed], out [heads, d_kv, embed] <-> [embed, heads*d_kv],
    MLP kernels transposed;
  - HF stores each stack's relative attention bias [buckets, heads] in its block 0 only (ours: one
    per stack, outside the blocks);
  - HF's embedding (and untied lm_head) has the vocabulary rounded up to a multiple of 128 (32128
    rows for T5's 32100 ids); ours has padded_vocab_size rows. Rows past the real ids are padding,
    masked in our logits; they are cut or zero-filled between the two sizes.
v1.0 ties the output to `shared` (HF scales the decoder output by d_model^-0.5, as we do); v1.1 has
its own `lm_head`. `encoder.embed_tokens` and `decoder.embed_tokens` are `shared` on HF's side.

Tying and scaling: transformers < 5.2 (and google's folders) scale exactly when tie_word_embeddings is
true; transformers >= 5.2 always writes tie_word_embeddings: true and records the scaling apart as
scale_decoder_outputs (false for a v1.1 configuration), saving no lm_head.weight for a tied head, and
keeps an lm_head.weight that differs from shared.weight untied. from-hf reads both flags and the
weights that way. to-hf writes a tied, unscaled head as an untied lm_head.weight equal to
shared.weight (tie_word_embeddings: false, scale_decoder_outputs: false), which transformers 4 and 5
both read with the same logits.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from models.t5 import FEED_FORWARD, T5Config
from t5x_like.convert.mapping import Entry, Stack, Transform
from t5x_like.errors import UserError

HF_MODEL_TYPE = "t5"
HF_VOCAB_MULTIPLE = 128
TIED = {"encoder.embed_tokens.weight": "shared.weight", "decoder.embed_tokens.weight": "shared.weight",
        "lm_head.weight": "shared.weight"}
"""HF names that share another tensor: written by to-torch where the checkpoint has no tensor of its own."""
SPIECE_EXTRA_IDS = 100
"""Sentinels (<extra_id_0..99>) that T5's tokenizer adds after the sentencepiece pieces."""


def hf_vocab_rows(config: T5Config) -> int:
    return -(-config.vocab_size // HF_VOCAB_MULTIPLE) * HF_VOCAB_MULTIPLE


def _resize_rows(table: np.ndarray, rows: int) -> np.ndarray:
    table = table[:rows]
    return np.pad(table, ((0, rows - table.shape[0]), (0, 0)))


def _vocab_rows_from_hf(theirs: np.ndarray, config: T5Config) -> list[np.ndarray]:
    """HF's table holds the vocabulary, or it rounded up to a multiple of 128; any other row count is another
    model's (a ValueError, which the import reports naming the tensor)."""
    if theirs.shape[0] not in (config.vocab_size, hf_vocab_rows(config)):
        raise ValueError(f"{theirs.shape[0]} rows for a vocabulary of {config.vocab_size}")
    return [_resize_rows(theirs, config.padded_vocab_size)]


VOCAB_ROWS = Transform(lambda ours, c: _resize_rows(ours[0], hf_vocab_rows(c)), _vocab_rows_from_hf)
HEADS_OUT = Transform(lambda ours, c: ours[0].reshape(c.embed_dim, -1).T,
                      lambda theirs, c: [theirs.T.reshape(c.embed_dim, c.num_heads, c.d_kv)])
HEADS_IN = Transform(lambda ours, c: ours[0].reshape(-1, c.embed_dim).T,
                     lambda theirs, c: [theirs.T.reshape(c.num_heads, c.d_kv, c.embed_dim)])
TRANSPOSED = Transform(lambda ours, c: ours[0].T, lambda theirs, c: [theirs.T])


def attention_entries(hf: str, ours: str) -> tuple[Entry, ...]:
    return tuple(Entry(f"{hf}.{h}.weight", (f"{ours}/{o}_kernel",), HEADS_IN if h == "o" else HEADS_OUT)
                 for h, o in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "out")))


def mlp_entries(config: T5Config, hf: str) -> tuple[Entry, ...]:
    names = (("wi_0", "gate"), ("wi_1", "fc")) if config.gated else (("wi", "fc"),)
    return tuple(Entry(f"{hf}.DenseReluDense.{h}.weight", (f"mlp/{o}_kernel",), TRANSPOSED)
                 for h, o in names + (("wo", "proj"),))


def layout(config: T5Config) -> tuple[tuple[Entry, ...], list[Stack]]:
    """(top-level entries, [encoder stack, decoder stack]) of this config."""
    top = (
        Entry("shared.weight", ("token_embedder/embedding",), VOCAB_ROWS),
        Entry("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", ("encoder/relpos_bias/embedding",)),
        Entry("encoder.final_layer_norm.weight", ("encoder/final_norm/scale",)),
        Entry("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", ("decoder/relpos_bias/embedding",)),
        Entry("decoder.final_layer_norm.weight", ("decoder/final_norm/scale",)),
    )
    if not config.tie_word_embeddings:
        top += (Entry("lm_head.weight", ("lm_head/embedding",), VOCAB_ROWS),)
    encoder = (
        Entry("layer.0.layer_norm.weight", ("pre_attention_norm/scale",)),
        *attention_entries("layer.0.SelfAttention", "attention"),
        Entry("layer.1.layer_norm.weight", ("pre_mlp_norm/scale",)),
        *mlp_entries(config, "layer.1"),
    )
    decoder = (
        Entry("layer.0.layer_norm.weight", ("pre_self_attention_norm/scale",)),
        *attention_entries("layer.0.SelfAttention", "self_attention"),
        Entry("layer.1.layer_norm.weight", ("pre_cross_attention_norm/scale",)),
        *attention_entries("layer.1.EncDecAttention", "cross_attention"),
        Entry("layer.2.layer_norm.weight", ("pre_mlp_norm/scale",)),
        *mlp_entries(config, "layer.2"),
    )
    return top, [Stack("encoder/", "encoder.block.{}.", encoder, config.num_layers),
                 Stack("decoder/", "decoder.block.{}.", decoder, config.num_decoder_layers)]


def config_for_tensors(config: T5Config, tensors: dict[str, np.ndarray]) -> T5Config:
    """A config that says tied but whose folder holds an lm_head.weight other than shared.weight (written
    by transformers 5 for a model untied in memory) is untied, as transformers 5 loads it."""
    head, shared = tensors.get("lm_head.weight"), tensors.get("shared.weight")
    if config.tie_word_embeddings and head is not None and not np.array_equal(head, shared):
        return dataclasses.replace(config, tie_word_embeddings=False)
    return config


def copied(config: T5Config) -> dict[str, str]:
    """HF names to-hf writes as copies of another tensor: a tied head that is not scaled."""
    tied_unscaled = config.tie_word_embeddings and not config.scale_decoder_outputs
    return {"lm_head.weight": "shared.weight"} if tied_unscaled else {}


def tokenizer_config(config: T5Config, tokenizer) -> dict:
    """tokenizer_config.json entries for T5's sentencepiece tokenizer (its pieces <pad>, </s>, <unk>); the ids
    past the tokenizer's own are its sentinels (<extra_id_0> the highest)."""
    return {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
            "extra_ids": config.vocab_size - tokenizer.vocab_size, "model_max_length": 512}


def config_to_hf(config: T5Config, eod_id: int | None) -> dict:
    """config.json contents for transformers' T5Config (HF sees the vocabulary rounded up to 128)."""
    return {
        "model_type": HF_MODEL_TYPE,
        "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": hf_vocab_rows(config),
        "d_model": config.embed_dim,
        "d_kv": config.d_kv,
        "d_ff": config.mlp_dim,
        "num_layers": config.num_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "num_heads": config.num_heads,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "dropout_rate": config.dropout_rate,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_factor": config.init_factor,
        "feed_forward_proj": config.feed_forward,
        "tie_word_embeddings": config.tie_word_embeddings and config.scale_decoder_outputs,
        "scale_decoder_outputs": config.scale_decoder_outputs,
        "is_encoder_decoder": True,
        "pad_token_id": 0,
        "eos_token_id": 1 if eod_id is None else eod_id,
        "decoder_start_token_id": 0,
        "torch_dtype": "float32",
    }


def real_vocab_size(hf: dict, source: str) -> int:
    """The tokenizer's size when a spiece.model sits beside config.json (its pieces plus the
    sentinels), else HF's vocab_size (every row a real id)."""
    spiece = os.path.join(os.path.dirname(source), "spiece.model")
    if not os.path.isfile(spiece):
        return hf["vocab_size"]
    import sentencepiece

    return sentencepiece.SentencePieceProcessor(model_file=spiece).get_piece_size() + SPIECE_EXTRA_IDS


def config_from_hf(hf: dict, source: str, **choices) -> T5Config:
    """Our config from a HF T5 config.json; `choices` are ours alone (scan_layers, dtype, ...).
    scale_decoder_outputs, when absent (transformers < 5.2), is tie_word_embeddings (absent: true)."""
    feed_forward, tied = hf.get("feed_forward_proj", "relu"), hf.get("tie_word_embeddings", True)
    if feed_forward not in FEED_FORWARD:
        raise UserError(f"{source}: feed_forward_proj={feed_forward!r} is not supported by our T5 "
                         f"(supported: {sorted(FEED_FORWARD)}).")
    return T5Config(
        vocab_size=real_vocab_size(hf, source), num_layers=hf["num_layers"],
        num_decoder_layers=hf.get("num_decoder_layers") or hf["num_layers"], num_heads=hf["num_heads"],
        embed_dim=hf["d_model"], d_kv=hf["d_kv"], mlp_dim=hf["d_ff"], feed_forward=feed_forward,
        tie_word_embeddings=tied, scale_decoder_outputs=hf.get("scale_decoder_outputs", tied),
        relative_attention_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf.get("relative_attention_max_distance", 128),
        dropout_rate=hf.get("dropout_rate", 0.1), layer_norm_eps=hf.get("layer_norm_epsilon", 1e-6),
        init_factor=hf.get("initializer_factor", 1.0), **choices)
