"""Qwen2-MoE presets (ml_collections), with the shapes of the published Hugging Face config: Qwen1.5-MoE-A2.7B
(60 experts of width 1408, top-4 without renormalising, a shared expert of width 5632 behind a sigmoid gate; 14.3B
parameters, 2.7B active per token). `qwen2_moe_tiny` is a 4-layer model for CPU runs over the builtin corpus's
8192-id tokenizer: 8 experts of width 128, top-2, and a shared expert of width 256.
"""
import ml_collections

_SHAPES = {
    #                      layers heads kv embed mlp  expert mlp experts top-k shared mlp vocab  max_len
    "qwen1_5_moe_a2_7b": (24, 16, 16, 2048, 5632, 1408, 60, 4, 5632, 151936, 8192),
    "qwen2_moe_tiny": (4, 4, 4, 256, 512, 128, 8, 2, 256, 8192, 256),
}

PRESETS = tuple(_SHAPES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS (e.g. 'qwen1_5_moe_a2_7b'); transformers' Qwen2MoeForCausalLM of
    the same config has as many parameters (tests/t5x_like/convert/test_qwen2_moe.py)."""
    layers, heads, kv_heads, embed, mlp, expert_mlp, experts, top_k, shared, vocab, max_len = _SHAPES[name]
    return ml_collections.ConfigDict(dict(
        family="qwen2_moe", num_layers=layers, num_heads=heads, num_key_value_heads=kv_heads, embed_dim=embed,
        mlp_dim=mlp, expert_mlp_dim=expert_mlp, num_experts=experts, num_experts_per_token=top_k,
        shared_expert_mlp_dim=shared, normalize_router_weights=False, qkv_bias=True, vocab_size=vocab,
        max_len=max_len, rope_theta=1e6, layer_norm_eps=1e-6, dropout_rate=0.0, attention_dropout_rate=0.0))
