"""GPT-2 model presets (ml_collections). Sizes follow the GPT-2 paper / HF configs.

`tiny` is the quickstart model: 4 layers, 256 wide, 4 heads (even counts, so it also splits
over tensor and pipeline axes) over the builtin corpus's 8192-id tokenizer.

CPM-1 (Zhang et al. 2020, CPM-Pretrain / CPM-Generate) is a GPT-2 over a 30000-piece Chinese sentencepiece
vocabulary: `cpm_1` is its 2.6B model (32 layers, width 2560, 32 heads, 1024 positions) and `cpm_1_tiny` a
4-layer one for CPU runs (its vocabulary is the run's CPM tokenizer's, see gin/models/cpm_1_tiny.gin).
"""
import ml_collections

from configs.errors import PresetError

_SIZES = {
    #        layers heads embed  vocab  max_len
    "tiny": (4, 4, 256, 8192, 256),
    "small": (12, 12, 768, 50257, 1024),
    "medium": (24, 16, 1024, 50257, 1024),
    "large": (36, 20, 1280, 50257, 1024),
    "xl": (48, 25, 1600, 50257, 1024),
    "175b": (96, 96, 12288, 50257, 2048),  # GPT-3 175B
}

_CPM_SIZES = {  # named cpm_<size>
    #          layers heads embed  vocab  max_len
    "1": (32, 32, 2560, 30000, 1024),
    "1_tiny": (4, 4, 256, 30000, 256),
}

SIZES = tuple(_SIZES)
PRESETS = tuple(f"gpt2_{size}" for size in SIZES) + tuple(f"cpm_{size}" for size in _CPM_SIZES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name, one of PRESETS: 'gpt2_<size>' or 'cpm_<size>'."""
    return get_config(name.partition("_")[2])


def get_config(size: str) -> ml_collections.ConfigDict:
    """The preset for one GPT-2 size ('tiny', 'small', 'medium', 'large', 'xl', '175b') or CPM size
    ('1': CPM-1 2.6B, '1_tiny')."""
    shapes = {**_SIZES, **_CPM_SIZES}
    if size not in shapes:
        raise PresetError(f"GPT-2 size {size!r} is unknown; choose one of {SIZES + tuple(_CPM_SIZES)}.")
    num_layers, num_heads, embed_dim, vocab_size, max_len = shapes[size]
    return ml_collections.ConfigDict(dict(
        family="gpt2",
        vocab_size=vocab_size,
        max_len=max_len,
        num_layers=num_layers,
        num_heads=num_heads,
        embed_dim=embed_dim,
        mlp_dim=4 * embed_dim,
        dropout_rate=0.1,
        attention_dropout_rate=0.1,
        layer_norm_eps=1e-5,
        init_std=0.02,
    ))
