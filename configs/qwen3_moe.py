"""Qwen3-MoE presets (ml_collections), with the shapes of the published Hugging Face configs (Qwen/Qwen3-*-A*B,
Yang et al. 2025): 128 experts, top-8 renormalised, heads of 128 with 4 key/value heads, a 151936-id vocabulary,
rotary base 1e6, 40960 positions, RMSNorm epsilon 1e-6, untied heads. Qwen3-30B-A3B: 48 layers of width 2048,
experts of width 768 (30.5B parameters, 3.3B active); Qwen3-235B-A22B: 94 layers of width 4096, experts of width
1536 (235B, 22B active). `qwen3_moe_tiny` is a 4-layer model for CPU runs over the builtin corpus's 8192-id
tokenizer: 8 heads of 64 on a 256-wide stream, 8 experts of width 128, top-2.
"""
import ml_collections

_SHAPES = {
    #                    layers heads kv embed mlp   expert mlp experts top-k head_dim vocab max_len
    "qwen3_30b_a3b": (48, 32, 4, 2048, 6144, 768, 128, 8, 128, 151936, 40960),
    "qwen3_235b_a22b": (94, 64, 4, 4096, 12288, 1536, 128, 8, 128, 151936, 40960),
    "qwen3_moe_tiny": (4, 8, 4, 256, 512, 128, 8, 2, 64, 8192, 256),
}

PRESETS = tuple(_SHAPES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS (e.g. 'qwen3_30b_a3b'); transformers' Qwen3MoeForCausalLM of the
    same config has as many parameters (tests/t5x_like/convert/test_qwen3_moe.py)."""
    layers, heads, kv_heads, embed, mlp, expert_mlp, experts, top_k, head_dim, vocab, max_len = _SHAPES[name]
    return ml_collections.ConfigDict(dict(
        family="qwen3_moe", num_layers=layers, num_heads=heads, num_key_value_heads=kv_heads, embed_dim=embed,
        mlp_dim=mlp, expert_mlp_dim=expert_mlp, num_experts=experts, num_experts_per_token=top_k,
        normalize_router_weights=True, head_dim=head_dim, vocab_size=vocab, max_len=max_len, rope_theta=1e6,
        layer_norm_eps=1e-6, tie_word_embeddings=False, dropout_rate=0.0, attention_dropout_rate=0.0))
