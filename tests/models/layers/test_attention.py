"""models/layers/attention.py against numpy: parameters (names, logical axes, initialisers), GPT-style
self-attention (biases, rotary), T5-style attention (no biases, additive bias, scale 1.0), BERT's key
padding mask, cross-attention and grouped key/value heads."""
import math

import numpy as np
import pytest

from models import layers
from tests.models.layers.references import (TOL, boxed, init, perturbed, rotary_reference, softmax_attention,
                                            values)

GPT = dict(num_heads=2, head_dim=4, init_std=0.3, out_init_std=0.2, qkv_bias=True, out_bias=True, attention="xla")
T5 = dict(num_heads=2, head_dim=3, query_init_std=0.5, init_std=0.4, out_init_std=0.3, attention="xla", scale=1.0)


def projections(x, p, context=None):
    """q, k, v in numpy from the parameters (k and v from the context when given)."""
    kv_input = x if context is None else context
    q = np.einsum("bte,ehd->bthd", x, p["query_kernel"]) + p.get("query_bias", 0.0)
    k, v = (np.einsum("bte,ehd->bthd", kv_input, p[f"{n}_kernel"]) + p.get(f"{n}_bias", 0.0) for n in ("key", "value"))
    return q, k, v


def output(attended, p):
    return np.einsum("bthd,hde->bte", attended, p["out_kernel"]) + p.get("out_bias", 0.0)


def test_self_attention_with_biases_and_rotary_matches_numpy():
    module = layers.Attention(**GPT, rotary=layers.Rotary(2, 50.0))
    x = np.random.default_rng(4).normal(size=(2, 6, 8)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 3]])
    segments = np.array([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    variables = init(module, 3, x, positions=positions)
    params = boxed(variables)
    for name in ("query", "key", "value"):
        kernel = params[f"{name}_kernel"]
        assert kernel.names == ("embed", "heads", "kv") and kernel.value.shape == (8, 2, 4)
        assert params[f"{name}_bias"].names == ("heads", "kv") and params[f"{name}_bias"].value.shape == (2, 4)
    assert params["out_kernel"].names == ("heads", "kv", "embed") and params["out_bias"].names == ("embed",)
    variables = perturbed(variables, 5)
    p = values(variables)
    q, k, v = projections(x, p)
    q, k = (rotary_reference(y, positions, 2, 50.0) for y in (q, k))
    mask = np.tril(np.ones((6, 6), bool))[None, None] & (segments[:, None, :, None] == segments[:, None, None, :])
    expected = output(softmax_attention(q, k, v, mask, 1 / math.sqrt(4)), p)
    got = module.apply(variables, x, segment_ids=segments, positions=positions)
    np.testing.assert_allclose(got[0], expected[0], **TOL)
    np.testing.assert_allclose(got[1, 2:], expected[1, 2:], **TOL)  # padding queries' outputs are unspecified
    with pytest.raises(ValueError, match="rotary embeddings need positions"):
        module.apply(variables, x)


@pytest.mark.parametrize("options, stds", [
    (GPT, {"query_kernel": 0.3, "key_kernel": 0.3, "value_kernel": 0.3, "out_kernel": 0.2}),
    (T5, {"query_kernel": 0.5, "key_kernel": 0.4, "value_kernel": 0.4, "out_kernel": 0.3})])
def test_initialisers(options, stds):
    module = layers.Attention(**{**options, "num_heads": 8, "head_dim": 16})
    params = boxed(init(module, 0, np.zeros((1, 2, 64), np.float32)))
    for name, std in stds.items():
        assert np.std(params[name].value) == pytest.approx(std, rel=0.05), name
    biases = [name for name in params if name.endswith("_bias")]
    assert sorted(biases) == (["key_bias", "out_bias", "query_bias", "value_bias"] if options is GPT else [])
    assert not any(params[name].value.any() for name in biases)


@pytest.mark.parametrize("use_bias", [False, True])
def test_bidirectional_attention_with_bias_scale_and_key_padding_matches_numpy(use_bias):
    rng = np.random.default_rng(7)
    module = layers.Attention(**{**T5, "scale": 0.7}, causal=False, qkv_bias=use_bias, out_bias=use_bias)
    x = rng.normal(size=(2, 5, 6)).astype(np.float32)
    bias = rng.normal(size=(1, 2, 5, 5)).astype(np.float32)
    kv_segments = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    variables = perturbed(init(module, 8, x), 9)
    p = values(variables)
    assert sorted(p) == sorted(["query_kernel", "key_kernel", "value_kernel", "out_kernel"]
                               + (["query_bias", "key_bias", "value_bias", "out_bias"] if use_bias else []))
    q, k, v = projections(x, p)
    mask = (kv_segments != 0)[:, None, None, :]
    expected = output(softmax_attention(q, k, v, mask, 0.7, bias), p)
    np.testing.assert_allclose(module.apply(variables, x, bias=bias, kv_segment_ids=kv_segments), expected, **TOL)


def test_cross_attention_matches_numpy():
    rng = np.random.default_rng(12)
    module = layers.Attention(**T5, causal=False)
    x = rng.normal(size=(2, 3, 6)).astype(np.float32)
    context = rng.normal(size=(2, 5, 6)).astype(np.float32)
    context_segments = np.array([[1] * 5, [1, 1, 1, 0, 0]])
    variables = init(module, 13, x, context=context, cross=True)
    p = values(variables)
    q, k, v = projections(x, p, context)
    expected = output(softmax_attention(q, k, v, (context_segments != 0)[:, None, None, :], 1.0), p)
    got = module.apply(variables, x, context=context, context_segment_ids=context_segments, cross=True)
    np.testing.assert_allclose(got, expected, **TOL)
    with pytest.raises(ValueError, match="cross-attention without a context reads the decoding cache"):
        module.apply(variables, x, context=None, cross=True)


def test_grouped_key_value_heads_match_numpy():
    module = layers.Attention(**{**GPT, "num_heads": 4}, num_kv_heads=2, rotary=layers.Rotary(4))
    x = np.random.default_rng(17).normal(size=(2, 5, 8)).astype(np.float32)
    positions = np.arange(5)[None]
    variables = init(module, 18, x, positions=positions)
    params = boxed(variables)
    assert params["query_kernel"].value.shape == (8, 4, 4) and params["out_kernel"].value.shape == (4, 4, 8)
    for name in ("key", "value"):
        assert params[f"{name}_kernel"].value.shape == (8, 2, 4) and params[f"{name}_bias"].value.shape == (2, 4)
        assert params[f"{name}_kernel"].names == ("embed", "heads", "kv")
    variables = perturbed(variables, 19)
    p = values(variables)
    q, k, v = projections(x, p)
    q, k = (rotary_reference(y, np.broadcast_to(positions, (2, 5)), 4, 10000.0) for y in (q, k))
    expected = output(softmax_attention(q, k, v, np.tril(np.ones((5, 5), bool))[None, None], 0.5), p)
    np.testing.assert_allclose(module.apply(variables, x, positions=positions), expected, **TOL)


def test_query_and_key_norms_per_head_before_rotary_match_numpy():
    """qk_norm_eps (Qwen3's q_norm / k_norm): an RMSNorm over each head of the queries and keys, scales [head_dim]
    on logical axis kv, before the rotary embeddings; values unnormed; heads wider than width / heads."""
    module = layers.Attention(num_heads=4, head_dim=6, init_std=0.3, out_init_std=0.2, num_kv_heads=2,
                              qk_norm_eps=1e-3, rotary=layers.Rotary(6, 100.0), attention="xla")
    x = np.random.default_rng(21).normal(size=(2, 5, 8)).astype(np.float32)
    positions = np.broadcast_to(np.arange(5), (2, 5))
    variables = init(module, 22, x, positions=positions)
    norms = {name: variables["params"].pop(f"{name}_norm")["scale"] for name in ("query", "key")}
    assert sorted(boxed(variables)) == ["key_kernel", "out_kernel", "query_kernel", "value_kernel"]
    assert all(s.names == ("kv",) and s.value.shape == (6,) and (s.value == 1).all() for s in norms.values())
    assert variables["params"]["query_kernel"].value.shape == (8, 4, 6)
    variables["params"].update({f"{name}_norm": {"scale": scale} for name, scale in norms.items()})
    variables = perturbed(variables, 23)
    p = values({"params": {k: v for k, v in variables["params"].items() if not k.endswith("_norm")}})
    q, k, v = projections(x, p)

    def rms(y, name):
        scale = np.asarray(variables["params"][f"{name}_norm"]["scale"].value)
        return y / np.sqrt(np.square(y).mean(-1, keepdims=True) + 1e-3) * scale

    q, k = (rotary_reference(rms(y, name), positions, 6, 100.0) for y, name in ((q, "query"), (k, "key")))
    expected = output(softmax_attention(q, k, v, np.tril(np.ones((5, 5), bool))[None, None], 6 ** -0.5), p)
    np.testing.assert_allclose(module.apply(variables, x, positions=positions), expected, **TOL)
