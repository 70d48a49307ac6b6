"""KV-cache decoding (mutable 'cache') equals recomputing the whole sequence, with and without
scanned layers and with left-padded rows (GPT-2, and GPT-NeoX whose rotary angles come from each
row's own positions); the training path is unchanged by the cache code."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from models.gpt2 import GPT2, GPT2Config
from models.neox import NeoXConfig

CONFIG = GPT2Config(vocab_size=301, max_len=24, num_layers=2, num_heads=3, embed_dim=24, mlp_dim=40,
                    dropout_rate=0.0, attention_dropout_rate=0.0)
NEOX_CONFIG = NeoXConfig(vocab_size=301, max_len=24, num_layers=2, num_heads=3, embed_dim=24, mlp_dim=40,
                         rotary_pct=0.5, use_parallel_residual=False)
PROMPT, TOTAL, PAD = 5, 11, 3  # row 0 prefills PROMPT + PAD tokens, row 1 PAD padding slots + PROMPT


def full_logits(model, params, tokens):
    return jax.jit(lambda p, t: model.apply({"params": p}, t))(params, tokens)


def decode_logits(model, params, tokens, pad):
    """Row 0: prefill PROMPT + pad tokens; row 1: `pad` padding slots, then PROMPT tokens. Then
    one token per step until the cache (TOTAL slots) is full. Returns each row's logits for its
    real tokens: row 0 [TOTAL], row 1 [TOTAL - pad]."""
    width = PROMPT + pad
    prompt = np.zeros((2, width), np.int32)
    prompt[0] = tokens[0, :width]
    prompt[1] = np.concatenate([np.full(pad, 7), tokens[1, :PROMPT]])
    valid = np.ones((2, width), bool)
    valid[1, :pad] = False
    positions = np.maximum(valid.cumsum(1) - 1, 0)
    create = jax.jit(lambda p: model.apply({"params": p}, jnp.zeros((2, TOTAL), jnp.int32),
                                           positions=jnp.zeros((2, TOTAL), jnp.int32),
                                           mutable=["cache"])[1]["cache"])
    step = jax.jit(lambda p, c, t, pos, seg: model.apply({"params": p, "cache": c}, t, positions=pos,
                                                          segment_ids=seg, mutable=["cache"]))
    cache = jax.tree.map(jnp.zeros_like, nn.meta.unbox(create(params)))
    logits, variables = step(params, cache, prompt, positions, valid.astype(np.int32))
    rows = [[logits[0]], [logits[1, pad:]]]
    for k in range(TOTAL - width):
        position = np.array([[width + k], [PROMPT + k]])
        next_tokens = np.array([[tokens[0, width + k]], [tokens[1, PROMPT + k]]], np.int32)
        logits, variables = step(params, variables["cache"], next_tokens, position, np.ones((2, 1), np.int32))
        rows[0].append(logits[0])
        rows[1].append(logits[1])
    return [np.asarray(jnp.concatenate(r, axis=0)) for r in rows]


@pytest.mark.parametrize("family_config", [CONFIG, NEOX_CONFIG], ids=lambda c: c.family)
@pytest.mark.parametrize("scan_layers", [True, False])
def test_cached_decoding_equals_full_recomputation(family_config, scan_layers):
    config = dataclasses.replace(family_config, scan_layers=scan_layers)
    model = models.build_model(config)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"])
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (2, TOTAL), 0, config.vocab_size))
    expected = np.asarray(full_logits(model, params, tokens))[..., :config.vocab_size]
    row0, row1 = decode_logits(model, params, tokens, PAD)
    np.testing.assert_allclose(row0[:, :config.vocab_size], expected[0], atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(row1[:, :config.vocab_size], expected[1, :TOTAL - PAD], atol=2e-5, rtol=1e-5)


def test_cache_is_stacked_per_layer_and_logically_named():
    model = GPT2(CONFIG)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"])
    zeros = jnp.zeros((2, 10), jnp.int32)
    cache = jax.eval_shape(lambda p: model.apply({"params": p}, zeros, positions=zeros, mutable=["cache"])[1],
                           params)["cache"]
    attn = cache["blocks"]["attn"]
    assert nn.meta.unbox(attn["cached_key"]).shape == (2, 2, 10, 3, 8)
    assert nn.get_partition_spec(attn)["cached_key"] == jax.sharding.PartitionSpec(
        "layers", "activation_batch", "activation_length", "activation_heads", "activation_kv")


def test_decoding_without_positions_is_refused():
    model = GPT2(CONFIG)
    params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))["params"])
    with pytest.raises(ValueError, match="needs explicit positions"):
        jax.eval_shape(lambda p: model.apply({"params": p}, jnp.zeros((1, 4), jnp.int32), mutable=["cache"]),
                       params)
