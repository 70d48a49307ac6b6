"""T5 model presets (ml_collections): T5 v1.0 (Raffel et al. 2020) and T5 v1.1, with the published
shapes (transformers' t5-* and google/t5-v1_1-* configs). Sizes: 'small', 'base', 'large', '3b',
'11b' (v1.0: ReLU MLP, tied output, dropout 0.1) and '1_1_small' ... '1_1_xxl' (v1.1: gated-GELU,
untied output, no dropout in pre-training), named 't5_small', 't5_1_1_base', ...

The vocabulary is T5's sentencepiece model (32000 pieces) plus its 100 sentinels: 32100 ids
(padded to 32128). `tiny` is the quickstart T5 v1.1: 4 + 4 layers, 256 wide, over the builtin
corpus's 8192-id tokenizer plus 100 sentinel ids above it (8292).
"""
import ml_collections

T5_VOCAB = 32100
TINY_VOCAB = 8192 + 100

_SIZES = {
    #            layers heads embed d_kv  mlp    v1.1   vocab
    "tiny": (4, 4, 256, 64, 1024, True, TINY_VOCAB),
    "small": (6, 8, 512, 64, 2048, False, T5_VOCAB),
    "base": (12, 12, 768, 64, 3072, False, T5_VOCAB),
    "large": (24, 16, 1024, 64, 4096, False, T5_VOCAB),
    "3b": (24, 32, 1024, 128, 16384, False, T5_VOCAB),
    "11b": (24, 128, 1024, 128, 65536, False, T5_VOCAB),
    "1_1_small": (8, 6, 512, 64, 1024, True, T5_VOCAB),
    "1_1_base": (12, 12, 768, 64, 2048, True, T5_VOCAB),
    "1_1_large": (24, 16, 1024, 64, 2816, True, T5_VOCAB),
    "1_1_xl": (24, 32, 2048, 64, 5120, True, T5_VOCAB),
    "1_1_xxl": (24, 64, 4096, 64, 10240, True, T5_VOCAB),
}

SIZES = tuple(_SIZES)
PRESETS = tuple(f"t5_{size}" for size in SIZES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS: 't5_<size>'."""
    return get_config(name.partition("_")[2])


def get_config(size: str) -> ml_collections.ConfigDict:
    """The preset for one T5 size (see SIZES; '1_1_*' are T5 v1.1)."""
    if size not in _SIZES:
        raise ValueError(f"T5 size {size!r} is unknown; choose one of {SIZES}.")
    num_layers, num_heads, embed_dim, d_kv, mlp_dim, v1_1, vocab_size = _SIZES[size]
    return ml_collections.ConfigDict(dict(
        family="t5",
        vocab_size=vocab_size,
        num_layers=num_layers,
        num_decoder_layers=num_layers,
        num_heads=num_heads,
        embed_dim=embed_dim,
        d_kv=d_kv,
        mlp_dim=mlp_dim,
        feed_forward="gated-gelu" if v1_1 else "relu",
        tie_word_embeddings=not v1_1,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0 if v1_1 else 0.1,
        layer_norm_eps=1e-6,
        init_factor=1.0,
    ))
