"""Mixtral presets (ml_collections), with the shapes of their published Hugging Face configs: Mixtral 8x7B
(Jiang et al. 2024: 8 experts, top-2, 46.7B parameters, 12.9B active per token) and 8x22B (141B, 39B active).
`mixtral_tiny` is a 4-layer model for CPU runs over the builtin corpus's 8192-id tokenizer: 4 experts of
width 256, top-2, so a token goes through as many MLP weights as llama_tiny's 512-wide MLP.
"""
import ml_collections

_SHAPES = {
    #                 layers heads kv embed  expert mlp experts top-k vocab  max_len
    "mixtral_8x7b": (32, 32, 8, 4096, 14336, 8, 2, 32000, 32768),
    "mixtral_8x22b": (56, 48, 8, 6144, 16384, 8, 2, 32768, 65536),
    "mixtral_tiny": (4, 4, 2, 256, 256, 4, 2, 8192, 256),
}

PRESETS = tuple(_SHAPES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS (e.g. 'mixtral_8x7b')."""
    layers, heads, kv_heads, embed, mlp, experts, top_k, vocab, max_len = _SHAPES[name]
    return ml_collections.ConfigDict(dict(
        family="mixtral", num_layers=layers, num_heads=heads, num_key_value_heads=kv_heads, embed_dim=embed,
        mlp_dim=mlp, num_experts=experts, num_experts_per_token=top_k, vocab_size=vocab, max_len=max_len,
        rope_theta=1e6 if name != "mixtral_tiny" else 1e4, layer_norm_eps=1e-5, dropout_rate=0.0,
        attention_dropout_rate=0.0))
