"""models/layers/kv_cache.py: decoding through the one KV cache equals the full forward, for GPT-style
self-attention (rotary keys cached, left padding), T5-style attention (an additive bias over every cache
slot), grouped key/value heads, a sliding window (Mistral) and cross-attention (the context's keys/values cached once); the cache's
variables, their logical axes, and the index that T5's decoder positions share."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models.layers import kv_cache
from tests.models.layers.references import TOL, init, rotary_reference


def decode_in_chunks(module, variables, x, positions, segments, chunks, **kwargs):
    """The cache created by a call as long as `x`, then `x` fed chunk by chunk through the cache."""
    extra = {k: jnp.zeros_like(v) for k, v in kwargs.items()}
    if positions is not None:
        extra["positions"] = positions
    _, created = module.apply(variables, jnp.zeros_like(x), mutable=["cache"], **extra)
    cache = nn.meta.unbox(created["cache"])
    outs, start = [], 0
    for size in chunks:
        piece = slice(start, start + size)
        extra = {k: v[:, :, piece] for k, v in kwargs.items()}  # bias [b, h, q, cache_len]: this chunk's rows
        if positions is not None:
            extra["positions"] = positions[:, piece]
        chunk_segments = None if segments is None else segments[:, piece]
        out, updated = module.apply({**variables, "cache": cache}, x[:, piece], segment_ids=chunk_segments,
                                    mutable=["cache"], **extra)
        cache = updated["cache"]
        outs.append(out)
        start += size
    return jnp.concatenate(outs, axis=1), cache


@pytest.mark.parametrize("num_heads, num_kv_heads", [(2, None), (4, 2)])
def test_gpt_style_decoding_equals_the_full_forward(num_heads, num_kv_heads):
    module = layers.Attention(num_heads, 4, 0.3, 0.3, num_kv_heads=num_kv_heads, qkv_bias=True, out_bias=True,
                              rotary=layers.Rotary(4), attention="xla")
    x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 7, 8)), jnp.float32)
    segments = np.array([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])  # row 1 left-padded
    positions = np.maximum(segments.cumsum(1) - 1, 0)
    variables = init(module, 3, x, positions=positions)
    full = module.apply(variables, x, segment_ids=segments, positions=positions)
    decoded, cache = decode_in_chunks(module, variables, x, positions, segments, [3, 1, 2, 1])
    np.testing.assert_allclose(decoded[0], full[0], **TOL)
    np.testing.assert_allclose(decoded[1, 2:], full[1, 2:], **TOL)
    assert cache["cache_index"] == 7 and cache["cache_index"].dtype == jnp.int32
    np.testing.assert_array_equal(cache["cached_valid"], segments != 0)
    p = variables["params"]
    k = np.einsum("bte,ehd->bthd", x, p["key_kernel"].value) + p["key_bias"].value
    assert cache["cached_key"].shape == (2, 7, num_kv_heads or num_heads, 4)
    np.testing.assert_allclose(cache["cached_key"], rotary_reference(np.asarray(k), positions, 4, 10000.0), **TOL)


def test_sliding_window_decoding_token_by_token_equals_the_full_forward():
    """Window 3, a 5-token prompt (longer than the window) then 4 tokens one at a time, 4 query heads over 2,
    rotary, one row left-padded by 2 (padding slots count toward the window, as transformers' cache
    positions do): the same as the full forward with the window, which differs from the one without."""
    module = layers.Attention(4, 4, 0.5, 0.5, num_kv_heads=2, rotary=layers.Rotary(4), window=3, attention="xla")
    x = jnp.asarray(np.random.default_rng(14).normal(size=(2, 9, 8)), jnp.float32)
    segments = np.array([[1] * 9, [0, 0] + [1] * 7])
    positions = np.maximum(segments.cumsum(1) - 1, 0)
    variables = init(module, 15, x, positions=positions)
    full = module.apply(variables, x, segment_ids=segments, positions=positions)
    decoded, _ = decode_in_chunks(module, variables, x, positions, segments, [5, 1, 1, 1, 1])
    np.testing.assert_allclose(decoded[0], full[0], **TOL)
    np.testing.assert_allclose(decoded[1, 2:], full[1, 2:], **TOL)
    unwindowed = module.clone(window=None).apply(variables, x, segment_ids=segments, positions=positions)
    assert np.abs(np.asarray(unwindowed - full)).max(-1)[:, 5:].min() > 1e-3  # every token from 5 on


def test_t5_style_decoding_with_a_bias_equals_the_full_forward():
    rng = np.random.default_rng(10)
    module = layers.Attention(2, 3, 0.4, 0.3, query_init_std=0.5, scale=1.0, attention="xla")
    x = jnp.asarray(rng.normal(size=(2, 6, 6)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(1, 2, 6, 6)), jnp.float32)
    segments = np.array([[1] * 6, [0, 1, 1, 1, 1, 1]])
    variables = init(module, 11, x)
    full = module.apply(variables, x, bias=bias, segment_ids=segments)
    decoded, cache = decode_in_chunks(module, variables, x, None, segments, [2, 1, 3], bias=bias)
    np.testing.assert_allclose(decoded[0], full[0], **TOL)
    np.testing.assert_allclose(decoded[1, 1:], full[1, 1:], **TOL)
    assert {k: (v.shape, v.dtype) for k, v in cache.items()} == {
        "cached_key": ((2, 6, 2, 3), jnp.float32), "cached_value": ((2, 6, 2, 3), jnp.float32),
        "cached_valid": ((2, 6), jnp.bool_), "cache_index": ((), jnp.int32)}
    np.testing.assert_array_equal(cache["cached_valid"], segments != 0)
    assert cache["cache_index"] == 6
    unsegmented = module.apply(variables, x, bias=bias)
    decoded, cache = decode_in_chunks(module, variables, x, None, None, [4, 2], bias=bias)
    np.testing.assert_allclose(decoded, unsegmented, **TOL)
    assert cache["cached_valid"].all()


def test_cache_variables_are_zeros_named_by_logical_axes():
    module = layers.Attention(2, 4, 0.3, 0.3, attention="xla", dtype=jnp.bfloat16)
    variables = init(module, 0, np.zeros((1, 2, 8), np.float32))
    _, created = module.apply(variables, jnp.zeros((3, 5, 8), jnp.bfloat16), mutable=["cache"])
    cache = created["cache"]
    assert {k: (v.value.shape, v.value.dtype, v.names) for k, v in cache.items()} == {
        "cached_key": ((3, 5, 2, 4), jnp.bfloat16, layers.BATCH_LENGTH_HEADS_KV),
        "cached_value": ((3, 5, 2, 4), jnp.bfloat16, layers.BATCH_LENGTH_HEADS_KV),
        "cached_valid": ((3, 5), jnp.bool_, layers.CACHE_BATCH_LENGTH),
        "cache_index": ((), jnp.int32, ())}
    assert not any(np.asarray(v.value).any() for v in cache.values())


def test_cross_attention_caches_the_context():
    rng = np.random.default_rng(12)
    module = layers.Attention(2, 3, 0.4, 0.3, query_init_std=0.5, causal=False, scale=1.0, attention="xla")
    x = jnp.asarray(rng.normal(size=(2, 3, 6)), jnp.float32)
    context = jnp.asarray(rng.normal(size=(2, 5, 6)), jnp.float32)
    context_segments = np.array([[1] * 5, [1, 1, 1, 0, 0]])
    variables = init(module, 13, x, context=context, cross=True)
    expected = module.apply(variables, x, context=context, context_segment_ids=context_segments, cross=True)
    first, boxed_cache = module.apply(variables, x[:, :1], context=context, context_segment_ids=context_segments,
                                      cross=True, mutable=["cache"])
    assert {k: v.names for k, v in boxed_cache["cache"].items()} == {
        "cached_key": layers.BATCH_LENGTH_HEADS_KV, "cached_value": layers.BATCH_LENGTH_HEADS_KV}
    cache = nn.meta.unbox(boxed_cache)
    p = variables["params"]
    for name in ("key", "value"):
        np.testing.assert_allclose(cache["cache"][f"cached_{name}"],
                                   np.einsum("bte,ehd->bthd", context, p[f"{name}_kernel"].value), **TOL)
    later = module.apply({**variables, **cache}, x[:, 1:], context=None, context_segment_ids=context_segments,
                         cross=True, mutable=["cache"])[0]
    np.testing.assert_allclose(jnp.concatenate([first, later], 1), expected, **TOL)


class Positions(nn.Module):
    """Caches what it is given, as T5's decoder caches its positions: created, then appended to."""

    @nn.compact
    def __call__(self, chunk):
        if not kv_cache.has(self, "cached_positions"):
            kv_cache.create(self, {"cached_positions": jnp.zeros_like(chunk)})
            return None
        index, cached = kv_cache.append(self, {"cached_positions": chunk})
        return index, cached["cached_positions"]


def test_create_then_append_at_the_index():
    _, created = Positions().apply({}, jnp.zeros((2, 5), jnp.int32), mutable=["cache"])
    cache = nn.meta.unbox(created["cache"])
    assert created["cache"]["cached_positions"].names == layers.CACHE_BATCH_LENGTH
    for start, chunk in ((0, jnp.array([[1, 2], [3, 4]])), (2, jnp.array([[5, 6, 7], [8, 9, 10]]))):
        (index, cached), updated = Positions().apply({"cache": cache}, chunk, mutable=["cache"])
        cache = updated["cache"]
        assert index == start and cache["cache_index"] == start + chunk.shape[1]
    np.testing.assert_array_equal(cached, [[1, 2, 5, 6, 7], [3, 4, 8, 9, 10]])
    assert jax.tree.structure(cache) == jax.tree.structure({"cache_index": 0, "cached_positions": 0})
