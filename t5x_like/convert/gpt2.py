"""GPT-2 <-> Hugging Face `GPT2LMHeadModel`: a name map plus four transforms.

HF GPT-2 stores linear layers as Conv1D, i.e. weights [in, out] like ours, so MLP kernels map
unchanged. What differs:
  - attention q/k/v are one fused `c_attn` [embed, 3*embed] (bias [3*embed]); ours are three
    [embed, heads, head_dim] kernels and [heads, head_dim] biases;
  - the attention output `c_proj` is [embed, embed]; ours is [heads, head_dim, embed];
  - our embedding table has padded_vocab_size rows (a multiple of vocab_pad_multiple); HF gets
    exactly vocab_size rows, and the padding rows are added back (zeros) on import. Padding ids
    never receive probability (the model masks their logits), so their values do not matter.
The output projection is tied to `wte` on both sides (`lm_head.weight` is `transformer.wte.weight`).
"""
from __future__ import annotations

import numpy as np

from models.gpt2 import GPT2Config
from t5x_like.convert.mapping import VOCAB_ROWS, Entry, Stack, Transform
from t5x_like.errors import UserError

HF_MODEL_TYPE = "gpt2"
HF_BLOCK_PREFIX = "transformer.h.{}."
TIED = {"lm_head.weight": "transformer.wte.weight"}
"""HF names that share another tensor: written by to-torch (a full state_dict), omitted by to-hf."""
BASE_MODEL_PREFIX = "transformer"
"""transformers' base_model_prefix: a GPT2Model checkpoint (the Hub's `gpt2`) names its tensors without it."""
UNUSED_HF_TENSORS = {r"(transformer\.)?h\.\d+\.attn\.(masked_)?bias": ""}
"""The causal-mask buffers older transformers saved in every block."""
HF_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh")


def _fuse_heads(ours, config: GPT2Config) -> np.ndarray:
    """3 x [embed, heads, head_dim] -> [embed, 3*embed]; 3 x [heads, head_dim] -> [3*embed]."""
    lead = ours[0].shape[:-2]
    return np.concatenate([x.reshape(*lead, config.embed_dim) for x in ours], axis=-1)


def _split_heads(theirs: np.ndarray, config: GPT2Config) -> list[np.ndarray]:
    lead = theirs.shape[:-1]
    return [x.reshape(*lead, config.num_heads, config.head_dim) for x in np.split(theirs, 3, axis=-1)]


FUSED_QKV = Transform(_fuse_heads, _split_heads)
HEADS_IN = Transform(lambda ours, c: ours[0].reshape(c.embed_dim, c.embed_dim),
                     lambda theirs, c: [theirs.reshape(c.num_heads, c.head_dim, c.embed_dim)])

TOP = (
    Entry("transformer.wte.weight", ("wte/embedding",), VOCAB_ROWS),
    Entry("transformer.wpe.weight", ("wpe/embedding",)),
    Entry("transformer.ln_f.weight", ("ln_f/scale",)),
    Entry("transformer.ln_f.bias", ("ln_f/bias",)),
)
BLOCK = (
    Entry("ln_1.weight", ("ln_1/scale",)),
    Entry("ln_1.bias", ("ln_1/bias",)),
    Entry("attn.c_attn.weight", ("attn/query_kernel", "attn/key_kernel", "attn/value_kernel"), FUSED_QKV),
    Entry("attn.c_attn.bias", ("attn/query_bias", "attn/key_bias", "attn/value_bias"), FUSED_QKV),
    Entry("attn.c_proj.weight", ("attn/out_kernel",), HEADS_IN),
    Entry("attn.c_proj.bias", ("attn/out_bias",)),
    Entry("ln_2.weight", ("ln_2/scale",)),
    Entry("ln_2.bias", ("ln_2/bias",)),
    Entry("mlp.c_fc.weight", ("mlp/fc_kernel",)),
    Entry("mlp.c_fc.bias", ("mlp/fc_bias",)),
    Entry("mlp.c_proj.weight", ("mlp/proj_kernel",)),
    Entry("mlp.c_proj.bias", ("mlp/proj_bias",)),
)


def layout(config: GPT2Config) -> tuple[tuple[Entry, ...], list[Stack]]:
    """(top-level entries, block stacks) of this config."""
    return TOP, [Stack("", HF_BLOCK_PREFIX, BLOCK, config.num_layers)]


def tokenizer_config(config: GPT2Config, tokenizer) -> dict:
    """tokenizer_config.json entries besides tokenizer_class: the end-of-document token throughout."""
    eod = tokenizer.id_to_token(tokenizer.eod_id)
    return {"bos_token": eod, "eos_token": eod, "unk_token": eod, "model_max_length": config.max_len}


def config_to_hf(config: GPT2Config, eod_id: int | None) -> dict:
    """config.json contents for transformers' GPT2Config (HF sees the unpadded vocabulary)."""
    return {
        "model_type": HF_MODEL_TYPE,
        "architectures": ["GPT2LMHeadModel"],
        "vocab_size": config.vocab_size,
        "n_positions": config.max_len,
        "n_embd": config.embed_dim,
        "n_layer": config.num_layers,
        "n_head": config.num_heads,
        "n_inner": config.mlp_dim,
        "activation_function": "gelu_new",
        "resid_pdrop": config.dropout_rate,
        "embd_pdrop": config.dropout_rate,
        "attn_pdrop": config.attention_dropout_rate,
        "layer_norm_epsilon": config.layer_norm_eps,
        "initializer_range": config.init_std,
        "scale_attn_weights": True,
        "scale_attn_by_inverse_layer_idx": False,
        "tie_word_embeddings": True,
        "bos_token_id": eod_id,
        "eos_token_id": eod_id,
        "torch_dtype": "float32",
    }


def config_from_hf(hf: dict, source: str, **choices) -> GPT2Config:
    """Our config from a HF GPT-2 config.json; `choices` are ours alone (scan_layers, dtype, ...)."""
    unsupported = {
        "activation_function": (hf.get("activation_function", "gelu_new"), HF_GELU_TANH),
        "scale_attn_weights": (hf.get("scale_attn_weights", True), (True,)),
        "scale_attn_by_inverse_layer_idx": (hf.get("scale_attn_by_inverse_layer_idx", False), (False,)),
        "add_cross_attention": (hf.get("add_cross_attention", False), (False,)),
        "tie_word_embeddings": (hf.get("tie_word_embeddings", True), (True,)),
    }
    for name, (value, allowed) in unsupported.items():
        if value not in allowed:
            raise UserError(f"{source}: {name}={value!r} is not supported by our GPT-2 (supported: {allowed}).")
    return GPT2Config(
        vocab_size=hf["vocab_size"], max_len=hf["n_positions"], num_layers=hf["n_layer"],
        num_heads=hf["n_head"], embed_dim=hf["n_embd"], mlp_dim=hf.get("n_inner") or 4 * hf["n_embd"],
        dropout_rate=hf.get("resid_pdrop", 0.1), attention_dropout_rate=hf.get("attn_pdrop", 0.1),
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5), init_std=hf.get("initializer_range", 0.02),
        **choices)
