"""Qwen3 dense model presets (ml_collections), with the shapes of their published Hugging Face configs (Qwen/Qwen3-*,
Yang et al. 2025): heads of 128 whatever the width, 8 key/value heads, a 151936-id vocabulary, rotary base 1e6,
40960 positions, RMSNorm epsilon 1e-6; 0.6B, 1.7B and 4B tie their output head to the input embedding.
`qwen3_tiny` is a 4-layer model for CPU runs over the builtin corpus's 8192-id tokenizer, its heads (8 of 64)
as untied from the width (256) as 0.6B's.
"""
import ml_collections

_SHAPES = {
    #              layers heads kv embed mlp    head_dim vocab  max_len tied
    "qwen3_0_6b": (28, 16, 8, 1024, 3072, 128, 151936, 40960, True),
    "qwen3_1_7b": (28, 16, 8, 2048, 6144, 128, 151936, 40960, True),
    "qwen3_4b": (36, 32, 8, 2560, 9728, 128, 151936, 40960, True),
    "qwen3_8b": (36, 32, 8, 4096, 12288, 128, 151936, 40960, False),
    "qwen3_14b": (40, 40, 8, 5120, 17408, 128, 151936, 40960, False),
    "qwen3_32b": (64, 64, 8, 5120, 25600, 128, 151936, 40960, False),
    "qwen3_tiny": (4, 8, 4, 256, 512, 64, 8192, 256, False),
}

PRESETS = tuple(_SHAPES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS (e.g. 'qwen3_0_6b'); transformers' Qwen3ForCausalLM of the same
    config has as many parameters (tests/t5x_like/convert/test_qwen3.py)."""
    layers, heads, kv_heads, embed, mlp, head_dim, vocab, max_len, tied = _SHAPES[name]
    return ml_collections.ConfigDict(dict(
        family="qwen3", num_layers=layers, num_heads=heads, num_key_value_heads=kv_heads, embed_dim=embed,
        mlp_dim=mlp, head_dim=head_dim, vocab_size=vocab, max_len=max_len, rope_theta=1e6, layer_norm_eps=1e-6,
        tie_word_embeddings=tied, dropout_rate=0.0, attention_dropout_rate=0.0))
