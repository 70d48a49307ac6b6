"""GPT-NeoX model presets (ml_collections): the Pythia suite (Biderman et al. 2023) and GPT-NeoX-20B
(Black et al. 2022), with their published shapes. All use rotary embeddings on a quarter of each
head (rotary_pct 0.25, base 10000), the parallel residual, a 4x MLP, LayerNorm eps 1e-5, 2048
positions, and the 20B tokenizer: vocab_size is its real size, 50277 ids. (The HF configs say
50304 or 50432, the rows NeoX padded the table to; padding rows never take probability here.)
"""
import ml_collections

_SHAPES = {
    #         layers heads embed
    "70m": (6, 8, 512),
    "160m": (12, 12, 768),
    "410m": (24, 16, 1024),
    "1b": (16, 8, 2048),
    "1.4b": (24, 16, 2048),
    "2.8b": (32, 32, 2560),
    "6.9b": (32, 32, 4096),
    "12b": (36, 40, 5120),
    "20b": (44, 64, 6144),
}
VOCAB_SIZE = 50277
"""The 20B tokenizer's ids (20B_tokenizer.json), shared by Pythia and NeoX-20B."""

PRESETS = tuple(f"neox_{size}" if size == "20b" else f"pythia_{size}" for size in _SHAPES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS: 'pythia_<size>' or 'neox_20b'."""
    return get_config(name.partition("_")[2])


def get_config(size: str) -> ml_collections.ConfigDict:
    """The preset of one size ('70m' ... '12b' for Pythia, '20b' for NeoX-20B)."""
    if size not in _SHAPES:
        raise ValueError(f"GPT-NeoX size {size!r} is unknown; choose one of {tuple(_SHAPES)}.")
    num_layers, num_heads, embed_dim = _SHAPES[size]
    return ml_collections.ConfigDict(dict(
        family="neox",
        vocab_size=VOCAB_SIZE,
        max_len=2048,
        num_layers=num_layers,
        num_heads=num_heads,
        embed_dim=embed_dim,
        mlp_dim=4 * embed_dim,
        rotary_pct=0.25,
        rotary_base=10000.0,
        use_parallel_residual=True,
        layer_norm_eps=1e-5,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
    ))
