"""models/qwen3.py: the config's checks, its FLOPs and summary with heads wider than width / heads, the block it
composes (Llama's with query/key norms) and its parameter tree (logits and decoding against transformers are
tests/t5x_like/convert/test_qwen3.py's)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models.qwen3 import Qwen3, Qwen3Block, Qwen3Config
from tests.models.layers.references import TOL, block_params, param_paths

# 3 heads of 12 on a 16-wide stream: heads x head_dim (36) is not the width, and 3 does not divide 16.
TINY = Qwen3Config(vocab_size=300, num_layers=2, num_heads=3, num_key_value_heads=1, embed_dim=16, head_dim=12,
                   mlp_dim=40, max_len=64, vocab_pad_multiple=128)


@pytest.mark.parametrize("fields, message", [
    (dict(qkv_bias=True), "qkv_bias True: qwen3 has no qkv bias option \\(family 'llama' has it\\)"),
    (dict(sliding_window=4), "sliding_window 4: qwen3 has no sliding window option \\(family 'llama' has it\\)"),
    (dict(head_dim=0), "head_dim 0 must be a positive integer"),
    (dict(num_key_value_heads=2), "num_kv_heads 2 does not divide num_heads 3"),
])
def test_config_errors_name_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **fields)


def test_flops_and_summary_count_heads_of_head_dim():
    """matmul weights: q and out 16·36 each, k and v 16·12 each, the SwiGLU's 3·16·40, the head's 300·16."""
    assert TINY.matmul_params() == 2 * (2 * 16 * 36 + 2 * 16 * 12 + 3 * 16 * 40) + 300 * 16
    t = 32
    assert TINY.train_flops_per_example({"targets": t}) == 6.0 * TINY.matmul_params() * t + 12.0 * 2 * t * t / 2 * 36
    assert TINY.summary() == ("qwen3: 2 layers, width 16, 3 heads x 12 (1 key/value heads) (rotary on 12), mlp 40, "
                              "query/key RMSNorm, vocab 300 (padded to 384), max_len 64, float32")
    assert TINY.rotary.dim == 12


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_tree_is_llamas_with_the_query_and_key_norms(tied):
    config = dataclasses.replace(TINY, tie_word_embeddings=tied)
    shapes = jax.eval_shape(lambda: Qwen3(config).init(jax.random.key(0), np.zeros((1, 8), np.int32)))["params"]
    flat = {"/".join(str(k.key) for k in path): leaf.value.shape
            for path, leaf in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: hasattr(x, "value"))[0]}
    assert set(flat) == {"embed_in/embedding", "ln_f/scale", *(["embed_out/embedding"] if not tied else []),
                         *(f"blocks/{p}" for p in ("ln_1/scale", "ln_2/scale", "attn/query_kernel", "attn/key_kernel",
                                                   "attn/value_kernel", "attn/out_kernel", "attn/query_norm/scale",
                                                   "attn/key_norm/scale", "mlp/gate_kernel", "mlp/fc_kernel",
                                                   "mlp/proj_kernel"))}
    assert flat["blocks/attn/query_kernel"] == (2, 16, 3, 12) and flat["blocks/attn/key_kernel"] == (2, 16, 1, 12)
    assert flat["blocks/attn/out_kernel"] == (2, 3, 12, 16)
    assert flat["blocks/attn/query_norm/scale"] == flat["blocks/attn/key_norm/scale"] == (2, 12)


def test_a_block_is_llamas_with_normed_queries_and_keys():
    """Qwen3Block: h = x + attn(ln_1 x), then h + mlp(ln_2 h), its attention RMSNorming each query and key head
    (epsilon layer_norm_eps) before rotary; the same parameters without the norms give another output."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 16)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    params = block_params(Qwen3Block(TINY, True), x, positions)
    assert {"attn/query_norm/scale", "attn/key_norm/scale"} <= param_paths(params)
    norm = layers.RMSNorm(TINY.layer_norm_eps)
    options = dict(num_kv_heads=1, rotary=layers.Rotary(12, 1e6))
    attention = layers.Attention(3, 12, 0.02, 0.02, qk_norm_eps=TINY.layer_norm_eps, **options)
    mlp = layers.MLP(40, "silu", 0.02, 0.02, gated=True)
    h = x + attention.apply({"params": params["attn"]}, norm.apply({"params": params["ln_1"]}, x), positions=positions)
    expected = h + mlp.apply({"params": params["mlp"]}, norm.apply({"params": params["ln_2"]}, h))
    got, _ = Qwen3Block(TINY, True).apply({"params": params}, x, None, positions)
    np.testing.assert_allclose(got, expected, **TOL)
    unnormed = {k: v for k, v in params["attn"].items() if not k.endswith("_norm")}
    plain = layers.Attention(3, 12, 0.02, 0.02, **options).apply(
        {"params": unnormed}, norm.apply({"params": params["ln_1"]}, x), positions=positions)
    assert not np.allclose(x + plain, h, atol=1e-3)
