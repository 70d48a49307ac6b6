"""CPM-2 presets (ml_collections): `cpm2`, the 11B of Zhang et al. 2021 as ModelCenter's `cpm2` config.json
and CPM-2-Finetune's cpm2_config.json give it (width 4096, 64 heads x 64, gated MLP 10240, 24 + 24 layers, the
26,240-id vocabulary of its vocab.txt, untied output), and `cpm2_tiny` (2 + 2 layers, 256 wide) for a CPU over
the same vocabulary.

Parameters (models/cpm2.py over T5's tree): 10,979,618,816 in the input embedding and the two stacks, plus
107,479,040 in the untied output projection (26,240 x 4,096): 11,087,097,856 in all.
"""
import ml_collections

CPM2_VOCAB = 26240

_SIZES = {
    #         layers heads embed d_kv mlp
    "cpm2": (24, 64, 4096, 64, 10240),
    "cpm2_tiny": (2, 4, 256, 64, 640),
}

PRESETS = tuple(_SIZES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS."""
    if name not in _SIZES:
        raise ValueError(f"CPM-2 preset {name!r} is unknown; choose one of {PRESETS}.")
    num_layers, num_heads, embed_dim, d_kv, mlp_dim = _SIZES[name]
    return ml_collections.ConfigDict(dict(
        family="cpm2",
        vocab_size=CPM2_VOCAB,
        num_layers=num_layers,
        num_decoder_layers=num_layers,
        num_heads=num_heads,
        embed_dim=embed_dim,
        d_kv=d_kv,
        mlp_dim=mlp_dim,
        feed_forward="gated-gelu",
        tie_word_embeddings=False,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        layer_norm_eps=1e-6,
        init_factor=1.0,
    ))
