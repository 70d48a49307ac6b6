"""models/llama.py: the config's checks, its FLOPs with a sliding window, the block it composes and the parameter
tree of each variant (logits against transformers are tests/t5x_like/convert/test_llama.py's)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models.llama import Llama, LlamaBlock, LlamaConfig
from tests.models.layers.references import TOL, block_params, param_paths

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


@pytest.mark.parametrize("fields", [{}, dict(qkv_bias=True), dict(sliding_window=3)])
def test_a_block_is_rms_norms_rotary_grouped_attention_and_swiglu_in_sequence(fields):
    """LlamaBlock: h = x + attn(ln_1 x), then h + mlp(ln_2 h); RMSNorm, rotary attention over 2 key/value heads
    (Qwen2's biases on query, key and value; Mistral's window), proj(silu(gate x) * fc x), no other biases."""
    config = dataclasses.replace(TINY, **fields)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 32)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    params = block_params(LlamaBlock(config, True), x, positions)
    biases = {f"attn/{p}_bias" for p in ("query", "key", "value")} if config.qkv_bias else set()
    assert param_paths(params) == {"ln_1/scale", "ln_2/scale", "mlp/gate_kernel", "mlp/fc_kernel", "mlp/proj_kernel",
                                   *(f"attn/{p}_kernel" for p in ("query", "key", "value", "out")), *biases}
    assert params["attn"]["key_kernel"].shape == (32, 2, 8)
    norm = layers.RMSNorm(config.layer_norm_eps)
    attention = layers.Attention(4, 8, 0.02, 0.02, num_kv_heads=2, qkv_bias=config.qkv_bias,
                                 rotary=layers.Rotary(8), window=config.sliding_window)
    mlp = layers.MLP(48, "silu", 0.02, 0.02, gated=True)
    h = x + attention.apply({"params": params["attn"]}, norm.apply({"params": params["ln_1"]}, x), positions=positions)
    expected = h + mlp.apply({"params": params["mlp"]}, norm.apply({"params": params["ln_2"]}, h))
    got, _ = LlamaBlock(config, True).apply({"params": params}, x, None, positions)
    np.testing.assert_allclose(got, expected, **TOL)
