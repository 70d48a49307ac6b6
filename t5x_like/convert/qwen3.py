"""Qwen3 dense decoders <-> Hugging Face `Qwen3ForCausalLM` (model_type 'qwen3'): Llama's name map and transforms
(convert/llama.py; q_proj [heads * head_dim, embed] is our query_kernel [embed, heads, head_dim] whatever the
width) plus the query/key norms, `self_attn.{q,k}_norm.weight` [head_dim] = our `attn/{query,key}_norm/scale`.
A tied head (0.6B, 1.7B, 4B) has no `lm_head` tensor.

Refused on import, in one line naming config.json and the value: a sliding window (use_sliding_window true, or
layer_types with sliding layers), attention_bias true (biases on q, k, v and o), an activation other than silu,
a rotary type other than default / llama3.
"""
from __future__ import annotations

from models.qwen3 import Qwen3Config
from t5x_like.convert import llama, mapping
from t5x_like.convert.mapping import Entry, Stack

HF_MODEL_TYPE = "qwen3"
TIED: dict[str, str] = {}
"""Untied by default; tied(config) names the tied head."""
QK_NORMS = (Entry("self_attn.q_norm.weight", ("attn/query_norm/scale",)),
            Entry("self_attn.k_norm.weight", ("attn/key_norm/scale",)))
tied = llama.tied
BASE_MODEL_PREFIX = llama.BASE_MODEL_PREFIX
UNUSED_HF_TENSORS = llama.UNUSED_HF_TENSORS
tokenizer_config = llama.tokenizer_config
"""The end-of-document token as bos, eos and unk (a folder's own tokenizer_config.json is copied over it)."""


def layout(config: Qwen3Config) -> tuple[tuple[Entry, ...], list[Stack]]:
    """Llama's (top-level entries, block stacks) with the query/key norms in every block."""
    top, stacks = llama.layout(config)
    return top, [stack._replace(entries=tuple(stack.entries) + QK_NORMS) for stack in stacks]


def config_to_hf(config: Qwen3Config, eod_id: int | None) -> dict:
    """config.json contents for transformers' Qwen3Config (unpadded vocabulary; full attention in every layer)."""
    hf = llama.config_to_hf(config, eod_id)
    del hf["mlp_bias"]
    hf.update(model_type=HF_MODEL_TYPE, architectures=["Qwen3ForCausalLM"], head_dim=config.head_dim,
              attention_bias=False, use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers,
              layer_types=["full_attention"] * config.num_layers)
    return hf


def config_from_hf(hf: dict, source: str, **choices) -> Qwen3Config:
    """Our config from a HF Qwen3 config.json; `choices` are ours alone (scan_layers, dtype, ...)."""
    llama.checked_heads(hf, source)
    rope, rope_type = mapping.rope_of(hf, source)
    layer_types = hf.get("layer_types") or ["full_attention"]
    llama.refuse_unsupported(source, HF_MODEL_TYPE, {
        "hidden_act": (hf.get("hidden_act", "silu"), ("silu",)),
        "attention_bias": (hf.get("attention_bias", False), (False,)),
        "rope_type": (rope_type, llama.ROPE_TYPES),
        "use_sliding_window": (hf.get("use_sliding_window", False), (False,)),
        "layer_types": (sorted(set(layer_types)), (["full_attention"],)),
    })
    return Qwen3Config(**llama.shared_fields(hf, rope, rope_type), head_dim=hf.get("head_dim", 128), **choices)
