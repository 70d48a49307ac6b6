"""models/llama.py: the config's checks, its FLOPs with a sliding window, and the parameter tree of each variant
(logits against transformers are tests/t5x_like/convert/test_llama.py's)."""
import dataclasses

import jax
import numpy as np
import pytest

from models.llama import Llama, LlamaConfig

TINY = LlamaConfig(vocab_size=300, num_layers=2, num_heads=4, num_key_value_heads=2, embed_dim=32, mlp_dim=48,
                   max_len=64, vocab_pad_multiple=128)


@pytest.mark.parametrize("fields, message", [
    (dict(sliding_window=0), "sliding_window 0 must be a positive token count"),
    (dict(rope_scaling_factor=0.5), r"need factor >= 1 and high > low > 0 \(Llama 3.1: 8, 1, 4\)"),
    (dict(rope_scaling_factor=8.0, rope_low_freq_factor=4.0, rope_high_freq_factor=1.0), "high > low > 0"),
    (dict(num_key_value_heads=3), "num_kv_heads 3 does not divide num_heads 4"),
])
def test_config_errors_name_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **fields)


def test_a_sliding_window_counts_the_pairs_it_attends():
    """Attention FLOPs: 12·L·pairs·heads·head_dim, pairs T²/2 without a window and T·W − W(W−1)/2 with one."""
    t, w = 32, 8
    full, windowed = TINY.train_flops_per_example({"targets": t}), dataclasses.replace(
        TINY, sliding_window=w).train_flops_per_example({"targets": t})
    per_pair = 12 * TINY.num_layers * TINY.num_heads * TINY.head_dim
    assert full - windowed == per_pair * (t * t / 2 - (t * w - w * (w - 1) / 2))
    assert dataclasses.replace(TINY, sliding_window=t).train_flops_per_example({"targets": t}) == full
    assert "sliding window 8" in dataclasses.replace(TINY, sliding_window=w).summary()


@pytest.mark.parametrize("fields, has_out, has_bias", [({}, True, False), (dict(tie_word_embeddings=True), False, False),
                                                       (dict(qkv_bias=True), True, True)])
def test_parameter_tree_of_each_variant(fields, has_out, has_bias):
    config = dataclasses.replace(TINY, **fields, scan_layers=True)
    shapes = jax.eval_shape(lambda: Llama(config).init(jax.random.key(0), np.zeros((1, 8), np.int32)))["params"]
    flat = {"/".join(str(k.key) for k in path): leaf.value.shape if hasattr(leaf, "value") else leaf.shape
            for path, leaf in jax.tree_util.tree_flatten_with_path(
                shapes, is_leaf=lambda x: hasattr(x, "value"))[0]}
    assert ("embed_out/embedding" in flat) == has_out
    assert flat["embed_in/embedding"] == (384, 32)
    assert flat["blocks/attn/query_kernel"] == (2, 32, 4, 8) and flat["blocks/attn/key_kernel"] == (2, 32, 2, 8)
    assert flat["blocks/mlp/gate_kernel"] == (2, 32, 48) and flat["blocks/ln_1/scale"] == (2, 32)
    assert ("blocks/attn/query_bias" in flat) == has_bias and "blocks/attn/out_bias" not in flat
    assert "blocks/mlp/fc_bias" not in flat and "ln_f/bias" not in flat
