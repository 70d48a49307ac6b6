"""models/layers.py, layer by layer, against numpy references (float32, rtol/atol 1e-5 unless stated):
parameters (names, logical axes, initialisers), rotary embeddings, T5's relative-position buckets (the
formula of transformers' T5Attention._relative_position_bucket), attention with and without the KV cache,
the feed-forward, the block stack, the tied logits' custom gradient, FP8 state and the small helpers."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers

TOL = dict(rtol=1e-5, atol=1e-5)


def init(module, seed, *args, **kwargs):
    """The module's parameters only (module.init's default would also create FP8 state, turning FP8 on)."""
    return module.init(jax.random.PRNGKey(seed), *args, mutable=["params"], **kwargs)


def boxed(variables):
    """{name: LogicallyPartitioned} of a module's parameters, checked to be boxed with logical names."""
    params = variables["params"]
    assert all(isinstance(p, nn.LogicallyPartitioned) for p in params.values()), params
    return params


def softmax_attention(q, k, v, mask, scale, bias=None):
    """numpy reference: q [b, t, h, d], k/v [b, s, h, d], mask [b or 1, h or 1, t, s] -> [b, t, h, d]."""
    logits = np.einsum("bthd,bshd->bhts", q, k) * scale + (0.0 if bias is None else bias)
    logits = np.where(mask, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhts,bshd->bthd", weights / weights.sum(-1, keepdims=True), v)


def rotary_reference(x, positions, rotary_dim, base):
    """GPT-NeoX's rotate-half RoPE (transformers' apply_rotary_pos_emb) in numpy."""
    inv_freq = 1.0 / base ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = positions[..., None] * inv_freq
    angles = np.concatenate([angles, angles], -1)[:, :, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], -1)
    return np.concatenate([rot * np.cos(angles) + rotated * np.sin(angles), rest], -1)


def t5_bucket_reference(relative_position, bidirectional, num_buckets, max_distance):
    """transformers' T5Attention._relative_position_bucket, in numpy."""
    buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).astype(np.int64) * num_buckets
        relative_position = np.abs(relative_position)
    else:
        relative_position = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (np.log(np.maximum(relative_position, 1) / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, relative_position, large)


def test_embed_parameter_lookup_and_tied_logits():
    embed = layers.Embed(num_embeddings=512, features=64, axes=("vocab", "embed"), init_std=0.05,
                         dtype=jnp.bfloat16)
    ids = jnp.array([[0, 5, 511]])
    variables = init(embed, 0, ids)
    table = boxed(variables)["embedding"]
    assert table.names == ("vocab", "embed") and table.value.shape == (512, 64) and table.value.dtype == jnp.float32
    assert np.std(table.value) == pytest.approx(0.05, rel=0.03)
    out = embed.apply(variables, ids)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(out, table.value[np.array([[0, 5, 511]])].astype(jnp.bfloat16))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 64)), jnp.bfloat16)
    logits = embed.apply(variables, x, method=layers.Embed.attend)
    assert logits.dtype == jnp.float32 and logits.shape == (1, 3, 512)
    reference = np.asarray(x, np.float32) @ np.asarray(table.value.astype(jnp.bfloat16), np.float32).T
    np.testing.assert_allclose(logits, reference, rtol=1e-5, atol=1e-5)
    head = layers.LMHead(num_embeddings=512, features=64, axes=("vocab", "embed"), init_std=0.05)
    head_vars = init(head, 0, x)
    np.testing.assert_allclose(head.apply(head_vars, x), head.apply(head_vars, x, method=layers.Embed.attend), **TOL)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tied_logits_gradient_equals_autodiff_in_the_operands_dtype(dtype):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 3, 8)), dtype)
    embedding = jnp.asarray(rng.normal(size=(11, 8)), dtype)
    weights = jnp.asarray(rng.normal(size=(2, 3, 11)), jnp.float32)

    def plain(x, e):
        return jnp.sum(jnp.einsum("bte,ve->btv", x.astype(jnp.float32), e.astype(jnp.float32)) * weights)

    grads = jax.grad(lambda x, e: jnp.sum(layers.tied_logits(x, e) * weights), argnums=(0, 1))(x, embedding)
    expected = jax.grad(plain, argnums=(0, 1))(x, embedding)
    tol = TOL if dtype == jnp.float32 else dict(rtol=2e-2, atol=5e-2)  # bf16 gradient inputs: ~3 digits
    for got, want, operand in zip(grads, expected, (x, embedding)):
        assert got.dtype == operand.dtype and got.shape == operand.shape
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **tol)


@pytest.mark.parametrize("rotary_dim, base", [(4, 10000.0), (8, 100.0)])
def test_apply_rotary_matches_neox_rotate_half(rotary_dim, base):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [7, 9, 11, 30, 100]])
    got = layers.apply_rotary(jnp.asarray(x), jnp.asarray(positions), rotary_dim, base)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, rotary_reference(x, positions, rotary_dim, base), rtol=1e-5, atol=2e-5)
    one_row = layers.apply_rotary(jnp.asarray(x), jnp.asarray(positions[1:]), rotary_dim, base)
    np.testing.assert_allclose(one_row, rotary_reference(x, positions[1:], rotary_dim, base), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance", [(True, 32, 128), (False, 32, 128),
                                                                      (True, 16, 20)])
def test_relative_position_bucket_matches_t5(bidirectional, num_buckets, max_distance):
    relative = np.arange(-300, 301)[None, :]
    got = layers.relative_position_bucket(jnp.asarray(relative, jnp.int32), bidirectional=bidirectional,
                                          num_buckets=num_buckets, max_distance=max_distance)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, t5_bucket_reference(relative, bidirectional, num_buckets, max_distance))


def self_attention_params(module, x, **kwargs):
    variables = init(module, 3, x, **kwargs)
    return variables, {k: np.asarray(v.value) for k, v in boxed(variables).items()}


def test_self_attention_parameters_and_forward_match_numpy():
    rng = np.random.default_rng(4)
    module = layers.SelfAttention(num_heads=2, head_dim=4, init_std=0.3, out_init_std=0.2, attention="xla",
                                  dropout_rate=0.0, rotary_dim=2, rotary_base=50.0)
    x = rng.normal(size=(2, 6, 8)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    segments = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    variables, _ = self_attention_params(module, x, segment_ids=None, deterministic=True, positions=positions)
    params = boxed(variables)
    for name in ("query", "key", "value"):
        kernel = params[f"{name}_kernel"]
        assert kernel.names == ("embed", "heads", "kv") and kernel.value.shape == (8, 2, 4)
        assert params[f"{name}_bias"].names == ("heads", "kv") and params[f"{name}_bias"].value.shape == (2, 4)
    assert params["out_kernel"].names == ("heads", "kv", "embed")
    # biases start at zero: give them values so the forward checks their use
    variables = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(5), p.shape), variables)
    p = {k: np.asarray(v.value) for k, v in boxed(variables).items()}
    q, k, v = (np.einsum("bte,ehd->bthd", x, p[f"{n}_kernel"]) + p[f"{n}_bias"] for n in ("query", "key", "value"))
    q, k = (rotary_reference(y, positions, 2, 50.0) for y in (q, k))
    mask = np.tril(np.ones((6, 6), bool))[None, None] & (segments[:, None, :, None] == segments[:, None, None, :])
    attended = softmax_attention(q, k, v, mask, 1 / math.sqrt(4))
    expected = np.einsum("bthd,hde->bte", attended, p["out_kernel"]) + p["out_bias"]
    got = module.apply(variables, x, segment_ids=segments, deterministic=True, positions=positions)
    np.testing.assert_allclose(got[0], expected[0], **TOL)
    np.testing.assert_allclose(got[1, 2:], expected[1, 2:], **TOL)  # padding queries' outputs are unspecified
    with pytest.raises(ValueError, match="rotary embeddings need positions"):
        module.apply(variables, x, segment_ids=None, deterministic=True)


def test_self_attention_initialisers():
    module = layers.SelfAttention(num_heads=8, head_dim=16, init_std=0.3, out_init_std=0.1, attention="xla",
                                  dropout_rate=0.0)
    _, p = self_attention_params(module, np.zeros((1, 2, 64), np.float32), segment_ids=None, deterministic=True)
    for name in ("query", "key", "value"):
        assert np.std(p[f"{name}_kernel"]) == pytest.approx(0.3, rel=0.05)
        assert not p[f"{name}_bias"].any()
    assert np.std(p["out_kernel"]) == pytest.approx(0.1, rel=0.05)


def decode_in_chunks(module, variables, x, positions, segments, chunks, **kwargs):
    """The cache created by a call as long as `x`, then `x` fed chunk by chunk through the cache."""
    _, created = module.apply(variables, jnp.zeros_like(x), segment_ids=None, deterministic=True, mutable=["cache"],
                              **{k: jnp.zeros_like(v) for k, v in kwargs.items()},
                              **({} if positions is None else {"positions": positions}))
    cache = nn.meta.unbox(created["cache"])
    outs, start = [], 0
    for size in chunks:
        piece = slice(start, start + size)
        extra = {k: v[:, :, piece] for k, v in kwargs.items()}  # bias [b, h, q, cache_len]: this chunk's rows
        if positions is not None:
            extra["positions"] = positions[:, piece]
        chunk_segments = None if segments is None else segments[:, piece]
        out, updated = module.apply({**variables, "cache": cache}, x[:, piece], segment_ids=chunk_segments,
                                    deterministic=True, mutable=["cache"], **extra)
        cache = updated["cache"]
        outs.append(out)
        start += size
    return jnp.concatenate(outs, axis=1), cache


def test_self_attention_cache_decoding_equals_the_full_forward():
    rng = np.random.default_rng(6)
    module = layers.SelfAttention(num_heads=2, head_dim=4, init_std=0.3, out_init_std=0.3, attention="xla",
                                  dropout_rate=0.0, rotary_dim=4)
    x = jnp.asarray(rng.normal(size=(2, 7, 8)), jnp.float32)
    segments = np.array([[1] * 7, [0, 0, 1, 1, 1, 1, 1]])  # row 1 left-padded
    positions = np.maximum(segments.cumsum(1) - 1, 0)
    variables, _ = self_attention_params(module, x, segment_ids=None, deterministic=True, positions=positions)
    full = module.apply(variables, x, segment_ids=segments, deterministic=True, positions=positions)
    decoded, cache = decode_in_chunks(module, variables, x, positions, segments, [3, 1, 2, 1])
    np.testing.assert_allclose(decoded[0], full[0], **TOL)
    np.testing.assert_allclose(decoded[1, 2:], full[1, 2:], **TOL)
    assert cache["cache_index"] == 7 and cache["cache_index"].dtype == jnp.int32
    np.testing.assert_array_equal(cache["cached_valid"], segments != 0)
    k = np.einsum("bte,ehd->bthd", x, variables["params"]["key_kernel"].value) + variables["params"]["key_bias"].value
    np.testing.assert_allclose(cache["cached_key"], rotary_reference(np.asarray(k), positions, 4, 10000.0), **TOL)


def test_self_attention_cache_variables():
    module = layers.SelfAttention(num_heads=2, head_dim=4, init_std=0.3, out_init_std=0.3, attention="xla",
                                  dropout_rate=0.0, dtype=jnp.bfloat16)
    variables, _ = self_attention_params(module, np.zeros((1, 2, 8), np.float32), segment_ids=None,
                                         deterministic=True)
    _, created = module.apply(variables, jnp.zeros((3, 5, 8), jnp.bfloat16), segment_ids=None, deterministic=True,
                              mutable=["cache"])
    cache = created["cache"]
    assert {k: (v.value.shape, v.value.dtype, v.names) for k, v in cache.items()} == {
        "cached_key": ((3, 5, 2, 4), jnp.bfloat16, layers.BATCH_LENGTH_HEADS_KV),
        "cached_value": ((3, 5, 2, 4), jnp.bfloat16, layers.BATCH_LENGTH_HEADS_KV),
        "cached_valid": ((3, 5), jnp.bool_, layers.CACHE_BATCH_LENGTH),
        "cache_index": ((), jnp.int32, ())}
    assert not any(np.asarray(v.value).any() for v in cache.values())


def t5_attention(**overrides):
    options = dict(num_heads=2, head_dim=3, query_init_std=0.5, init_std=0.4, out_init_std=0.3, causal=True,
                   attention="xla", dropout_rate=0.0, scale=1.0)
    return layers.Attention(**{**options, **overrides})


@pytest.mark.parametrize("use_bias", [False, True])
def test_attention_forward_with_bias_and_scale_matches_numpy(use_bias):
    rng = np.random.default_rng(7)
    module = t5_attention(causal=False, use_bias=use_bias, scale=0.7)
    x = rng.normal(size=(2, 5, 6)).astype(np.float32)
    bias = rng.normal(size=(1, 2, 5, 5)).astype(np.float32)
    kv_segments = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    variables = init(module, 8, x, deterministic=True)
    variables = jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(9), p.shape), variables)
    params = boxed(variables)
    assert sorted(params) == sorted(["query_kernel", "key_kernel", "value_kernel", "out_kernel"]
                                    + (["query_bias", "key_bias", "value_bias", "out_bias"] if use_bias else []))
    p = {k: np.asarray(v.value) for k, v in params.items()}
    q, k, v = (np.einsum("bte,ehd->bthd", x, p[f"{n}_kernel"]) + p.get(f"{n}_bias", 0.0)
               for n in ("query", "key", "value"))
    mask = (kv_segments != 0)[:, None, None, :]
    expected = np.einsum("bthd,hde->bte", softmax_attention(q, k, v, mask, 0.7, bias), p["out_kernel"])
    expected = expected + p.get("out_bias", 0.0)
    got = module.apply(variables, x, deterministic=True, bias=bias, kv_segment_ids=kv_segments)
    np.testing.assert_allclose(got, expected, **TOL)


def test_attention_initialisers_and_axes():
    module = t5_attention(num_heads=8, head_dim=16, use_bias=True)
    params = boxed(init(module, 0, np.zeros((1, 2, 64), np.float32), deterministic=True))
    stds = {"query_kernel": 0.5, "key_kernel": 0.4, "value_kernel": 0.4, "out_kernel": 0.3}
    for name, std in stds.items():
        assert np.std(params[name].value) == pytest.approx(std, rel=0.05), name
    for name in ("query", "key", "value"):
        assert params[f"{name}_kernel"].names == ("embed", "heads", "kv")
        assert params[f"{name}_bias"].names == ("heads", "kv") and not params[f"{name}_bias"].value.any()
    assert params["out_kernel"].names == ("heads", "kv", "embed") and params["out_bias"].names == ("embed",)


def test_attention_cached_self_attention_with_bias_equals_the_full_forward():
    rng = np.random.default_rng(10)
    module = t5_attention()
    x = jnp.asarray(rng.normal(size=(2, 6, 6)), jnp.float32)
    bias = jnp.asarray(rng.normal(size=(1, 2, 6, 6)), jnp.float32)
    segments = np.array([[1] * 6, [0, 1, 1, 1, 1, 1]])
    variables = init(module, 11, x, deterministic=True)
    full = module.apply(variables, x, deterministic=True, bias=bias, segment_ids=segments)
    decoded, cache = decode_in_chunks(module, variables, x, None, segments, [2, 1, 3], bias=bias)
    np.testing.assert_allclose(decoded[0], full[0], **TOL)
    np.testing.assert_allclose(decoded[1, 1:], full[1, 1:], **TOL)
    assert {k: (v.shape, v.dtype) for k, v in cache.items()} == {
        "cached_key": ((2, 6, 2, 3), jnp.float32), "cached_value": ((2, 6, 2, 3), jnp.float32),
        "cached_valid": ((2, 6), jnp.bool_), "cache_index": ((), jnp.int32)}
    np.testing.assert_array_equal(cache["cached_valid"], segments != 0)
    assert cache["cache_index"] == 6
    unsegmented = module.apply(variables, x, deterministic=True, bias=bias)
    decoded, cache = decode_in_chunks(module, variables, x, None, None, [4, 2], bias=bias)
    np.testing.assert_allclose(decoded, unsegmented, **TOL)
    assert cache["cached_valid"].all()


def test_attention_cross_attention_caches_the_context():
    rng = np.random.default_rng(12)
    module = t5_attention(causal=False)
    x = jnp.asarray(rng.normal(size=(2, 3, 6)), jnp.float32)
    context = jnp.asarray(rng.normal(size=(2, 5, 6)), jnp.float32)
    context_segments = np.array([[1] * 5, [1, 1, 1, 0, 0]])
    variables = init(module, 13, x, context=context, cross=True, deterministic=True)
    p = {k: np.asarray(v.value) for k, v in boxed(variables).items()}
    q = np.einsum("bte,ehd->bthd", x, p["query_kernel"])
    k, v = (np.einsum("bte,ehd->bthd", context, p[f"{n}_kernel"]) for n in ("key", "value"))
    mask = (context_segments != 0)[:, None, None, :]
    expected = np.einsum("bthd,hde->bte", softmax_attention(q, k, v, mask, 1.0), p["out_kernel"])
    full = module.apply(variables, x, context=context, context_segment_ids=context_segments, cross=True,
                        deterministic=True)
    np.testing.assert_allclose(full, expected, **TOL)
    first, boxed_cache = module.apply(variables, x[:, :1], context=context, context_segment_ids=context_segments,
                                cross=True, deterministic=True, mutable=["cache"])
    assert {k: v.names for k, v in boxed_cache["cache"].items()} == {
        "cached_key": layers.BATCH_LENGTH_HEADS_KV, "cached_value": layers.BATCH_LENGTH_HEADS_KV}
    cache = nn.meta.unbox(boxed_cache)
    np.testing.assert_allclose(cache["cache"]["cached_key"], k, **TOL)
    np.testing.assert_allclose(cache["cache"]["cached_value"], v, **TOL)
    later = module.apply({**variables, **cache}, x[:, 1:], context=None, context_segment_ids=context_segments,
                         cross=True, deterministic=True, mutable=["cache"])[0]
    np.testing.assert_allclose(jnp.concatenate([first, later], 1), expected, **TOL)
    with pytest.raises(ValueError, match="cross-attention without a context reads the decoding cache"):
        module.apply(variables, x, context=None, cross=True, deterministic=True)


@pytest.mark.parametrize("gated, activation", [(False, "relu"), (True, "gelu_tanh")])
def test_feed_forward_matches_numpy(gated, activation):
    rng = np.random.default_rng(14)
    module = layers.FeedForward(mlp_dim=7, activation=activation, gated=gated, init_std=0.5, out_init_std=0.3,
                                dropout_rate=0.0)
    x = rng.normal(size=(2, 3, 5)).astype(np.float32)
    variables = init(module, 15, x, deterministic=True)
    params = boxed(variables)
    assert params["fc_kernel"].names == ("embed", "mlp") and params["proj_kernel"].names == ("mlp", "embed")
    p = {k: np.asarray(v.value) for k, v in params.items()}
    h = x @ p["fc_kernel"]
    if gated:
        g = x @ p["gate_kernel"]
        h = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3))) * h
    else:
        h = np.maximum(h, 0)
    np.testing.assert_allclose(module.apply(variables, x, deterministic=True), h @ p["proj_kernel"], **TOL)
    wide = layers.FeedForward(mlp_dim=256, activation=activation, gated=gated, init_std=0.5, out_init_std=0.1,
                              dropout_rate=0.0, dtype=jnp.bfloat16)
    wide_vars = init(wide, 0, np.zeros((1, 1, 128), np.float32), deterministic=True)
    assert np.std(wide_vars["params"]["fc_kernel"].value) == pytest.approx(0.5, rel=0.05)
    assert np.std(wide_vars["params"]["proj_kernel"].value) == pytest.approx(0.1, rel=0.05)
    assert wide_vars["params"]["fc_kernel"].value.dtype == jnp.float32
    assert wide.apply(wide_vars, jnp.ones((1, 2, 128), jnp.bfloat16), deterministic=True).dtype == jnp.bfloat16


class Scale(nn.Module):
    """A block for block_stack: x * w + shift (w a per-layer parameter, shift broadcast to every layer)."""

    features: int

    @nn.compact
    def __call__(self, x, shift):
        w = layers.logical_param(self, "w", nn.initializers.normal(1.0), (self.features,), ("embed",), jnp.float32)
        return x * w + shift, None


class Stack(nn.Module):
    scan_layers: bool
    layer_stack: object = None

    @nn.compact
    def __call__(self, x, shift):
        stack = layers.block_stack(Scale, (4,), num_layers=3, scan_layers=self.scan_layers, broadcast_args=1,
                                   layer_stack=self.layer_stack)
        return stack(x, shift)[0]


def test_block_stack_scanned_equals_unrolled():
    x, shift = jnp.arange(8.0).reshape(2, 4), jnp.full((2, 4), 0.5)
    scanned = init(Stack(scan_layers=True), 0, x, shift)
    w = scanned["params"][layers.STACKED]["w"]
    assert w.value.shape == (3, 4) and w.names == ("layers", "embed")
    assert len({tuple(np.asarray(row)) for row in w.value}) == 3  # each layer its own initial values
    unrolled = {"params": {layers.UNROLLED.format(i): {"w": nn.LogicallyPartitioned(w.value[i], ("embed",))}
                           for i in range(3)}}
    expected = np.asarray(x)
    for i in range(3):
        expected = expected * np.asarray(w.value[i]) + 0.5
    np.testing.assert_allclose(Stack(scan_layers=True).apply(scanned, x, shift), expected, **TOL)
    np.testing.assert_allclose(Stack(scan_layers=False).apply(unrolled, x, shift), expected, **TOL)
    assert sorted(init(Stack(scan_layers=False), 0, x, shift)["params"]) == [
        "block_0", "block_1", "block_2"]


def test_block_stack_layer_stack_hook():
    seen = []

    def hook(block, stack):
        seen.append(block)
        return stack

    x, shift = jnp.ones((2, 4)), jnp.zeros((2, 4))
    init(Stack(scan_layers=True, layer_stack=hook), 0, x, shift)
    assert seen == [Scale]
    with pytest.raises(ValueError, match="needs scan_layers=True; set model_config.scan_layers = True"):
        init(Stack(scan_layers=False, layer_stack=hook), 0, x, shift)


class Positions(nn.Module):
    @nn.compact
    def __call__(self, tokens, positions=None):
        return layers.decoder_positions(self, tokens, positions, max_len=4)


def test_decoder_positions():
    tokens = jnp.zeros((2, 3), jnp.int32)
    variables = init(Positions(), 0, tokens)
    np.testing.assert_array_equal(Positions().apply(variables, tokens), [[0, 1, 2]])
    given = jnp.array([[0, 0, 1], [0, 1, 2]])
    np.testing.assert_array_equal(Positions().apply(variables, tokens, given), given)
    np.testing.assert_array_equal(Positions().apply(variables, tokens, given, mutable=["cache"])[0], given)
    with pytest.raises(ValueError, match="sequence length 5 exceeds the model's max_len 4"):
        Positions().apply(variables, jnp.zeros((1, 5), jnp.int32))
    Positions().apply(variables, jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"decoding \(mutable 'cache'\) needs explicit positions"):
        Positions().apply(variables, tokens, mutable=["cache"])


def test_mask_vocab_padding():
    logits = jnp.asarray(np.random.default_rng(16).normal(size=(2, 3, 8)), jnp.float32)
    masked = layers.mask_vocab_padding(logits, 5)
    np.testing.assert_array_equal(masked[..., :5], logits[..., :5])
    assert (np.asarray(masked[..., 5:]) == np.finfo(np.float32).min).all()


def test_remat_policies():
    assert layers.remat(Scale, "none") is Scale
    with pytest.raises(ValueError) as raised:
        layers.remat(Scale, "everything")
    assert str(raised.value) == ("remat policy 'everything' is unknown; choose 'none' or one of "
                                 f"{sorted(layers.REMAT_POLICIES)}.")
    x = jnp.arange(4.0)
    variables = init(Scale(4), 0, x, 1.0)
    for policy in ("full", "minimal", "save_dots", "save_qkv_proj"):
        wrapped = layers.remat(Scale, policy)
        assert wrapped is not Scale
        loss = lambda v, m=wrapped: jnp.sum(m(4).apply(v, x, 1.0)[0] ** 2)
        reference = lambda v: jnp.sum(Scale(4).apply(v, x, 1.0)[0] ** 2)
        np.testing.assert_allclose(jax.grad(loss)(variables)["params"]["w"].value,
                                   jax.grad(reference)(variables)["params"]["w"].value, **TOL)


def test_scaled_residual_std_is_gpt2s():
    assert layers.scaled_residual_std(0.02, 12) == pytest.approx(0.02 / math.sqrt(24), rel=1e-12)


class Fp8Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
        kernel = layers.logical_param(self, "kernel", nn.initializers.normal(1.0), (4, 3), ("embed", "mlp"),
                                      jnp.float32)
        return layers.dense_einsum("fc", "bi,io->bo", x, kernel)


def test_fp8_state_variables():
    x = jnp.ones((2, 4))
    plain = init(Fp8Dense(), 0, x)
    assert layers.FP8_STATE not in plain
    variables = Fp8Dense().init(jax.random.PRNGKey(0), x, mutable=["params", layers.FP8_STATE])
    state = variables[layers.FP8_STATE]["fc_einsum"]
    expected = {f"{name}_{kind}" for name in ("input", "kernel", "output_grad") for kind in ("scale", "amax_history")}
    assert set(state) == expected
    for name, value in state.items():
        assert value.names == (None,) and value.value.dtype == jnp.float32
        if name.endswith("_scale"):
            np.testing.assert_array_equal(value.value, np.ones(1))
        else:
            np.testing.assert_array_equal(value.value, np.zeros(1024))
