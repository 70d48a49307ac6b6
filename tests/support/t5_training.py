"""The tiny T5 that trains on span-corruption batches of the builtin corpus (tests/t5x_like/test_t5_training.py,
and the scan-layout tests that train it too)."""
from models.t5 import T5Config
from t5x_like.data import SourceSettings, make_source

LENGTHS = {"inputs": 32, "targets": 8}
# the builtin corpus's 8192 ids + 100 sentinels; 4 heads and a vocabulary padded to 8320 divide every mesh
CONFIG = T5Config(vocab_size=8292, num_layers=2, num_decoder_layers=2, num_heads=4, embed_dim=32, d_kv=8, mlp_dim=64,
                  feed_forward="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0, dtype="float32")


def span_corruption(split: str, *, packing: bool = False, **request):
    """The builtin corpus's span-corruption batches (make_source's `request`: batch size, lengths, seed, shard)."""
    return make_source(split, SourceSettings(objective="span_corruption", packing=packing), **request)
