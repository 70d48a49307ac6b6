"""Llama-class model presets (ml_collections), with the shapes of their published Hugging Face configs:
Llama 2 (Touvron et al. 2023), Llama 3 and 3.1 (Grattafiori et al. 2024; 3.1 scales its rotary frequencies
for 128k positions), Mistral 7B v0.1 (Jiang et al. 2023; a 4096-token sliding window) and Qwen2 (Yang et al.
2024; biases on query, key and value, the 0.5B's head tied to its input embedding). `llama_tiny` is a 4-layer
model for CPU runs over the builtin corpus's 8192-id tokenizer.
"""
import ml_collections

_SHAPES = {
    #              layers heads kv  embed  mlp    vocab   max_len  rope_theta  norm eps
    "llama2_7b": (32, 32, None, 4096, 11008, 32000, 4096, 1e4, 1e-5),
    "llama2_13b": (40, 40, None, 5120, 13824, 32000, 4096, 1e4, 1e-5),
    "llama2_70b": (80, 64, 8, 8192, 28672, 32000, 4096, 1e4, 1e-5),
    "llama3_8b": (32, 32, 8, 4096, 14336, 128256, 8192, 5e5, 1e-5),
    "llama3_70b": (80, 64, 8, 8192, 28672, 128256, 8192, 5e5, 1e-5),
    "llama3_1_8b": (32, 32, 8, 4096, 14336, 128256, 131072, 5e5, 1e-5),
    "llama3_1_70b": (80, 64, 8, 8192, 28672, 128256, 131072, 5e5, 1e-5),
    "mistral_7b": (32, 32, 8, 4096, 14336, 32000, 32768, 1e4, 1e-5),
    "qwen2_0_5b": (24, 14, 2, 896, 4864, 151936, 131072, 1e6, 1e-6),
    "qwen2_1_5b": (28, 12, 2, 1536, 8960, 151936, 131072, 1e6, 1e-6),
    "qwen2_7b": (28, 28, 4, 3584, 18944, 152064, 131072, 1e6, 1e-6),
    "llama_tiny": (4, 4, 2, 256, 512, 8192, 256, 1e4, 1e-5),
}
_OPTIONS = {
    "llama3_1_8b": dict(rope_scaling_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                        rope_original_max_len=8192),
    "mistral_7b": dict(sliding_window=4096),
    "qwen2_0_5b": dict(qkv_bias=True, tie_word_embeddings=True),
    "qwen2_1_5b": dict(qkv_bias=True, tie_word_embeddings=True),
    "qwen2_7b": dict(qkv_bias=True),
}
_OPTIONS["llama3_1_70b"] = _OPTIONS["llama3_1_8b"]

PRESETS = tuple(_SHAPES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS (e.g. 'llama3_8b', 'mistral_7b')."""
    layers, heads, kv_heads, embed, mlp, vocab, max_len, theta, eps = _SHAPES[name]
    return ml_collections.ConfigDict(dict(
        family="llama", num_layers=layers, num_heads=heads, num_key_value_heads=kv_heads, embed_dim=embed,
        mlp_dim=mlp, vocab_size=vocab, max_len=max_len, rope_theta=theta, layer_norm_eps=eps,
        dropout_rate=0.0, attention_dropout_rate=0.0, **_OPTIONS.get(name, {})))
