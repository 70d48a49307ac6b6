"""models.attention: implementation choice, and 'pallas' (interpreted) equal to 'xla' with and
without a mesh. Tolerance: float32, max abs error 1e-4 on outputs and gradients (O(1) values)."""
from unittest import mock

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from models import attention
from models.attention import choose_implementation, dot_product_attention

MESH_AXES = ("data", "stage", "fsdp", "tensor")
RULES = [("activation_batch", ("data", "fsdp")), ("activation_heads", "tensor"),
         ("activation_length", None), ("activation_kv", None)]


def inputs(batch, length, heads, kv_heads, head_dim=64, seed=0):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    return (jax.random.normal(kq, (batch, length, heads, head_dim)),
            jax.random.normal(kk, (batch, length, kv_heads, head_dim)),
            jax.random.normal(kv, (batch, length, kv_heads, head_dim)))


def packed(batch, length):
    ids = np.ones((batch, length), np.int32)
    ids[:, length // 3:] = 2
    ids[:, -5:] = 0
    return jnp.asarray(ids)


def loss_and_grads(implementation, segment_ids):
    def loss(q, k, v):
        out = dot_product_attention(q, k, v, causal=True, segment_ids=segment_ids,
                                    implementation=implementation)
        return jnp.sum(jnp.sin(out)), out

    return jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)


def assert_close(got, want):
    (_, got_out), got_grads = got
    (_, want_out), want_grads = want
    for g, w in zip((got_out, *got_grads), (want_out, *want_grads)):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=0)


def test_pallas_without_mesh_equals_xla():
    q, k, v = inputs(2, 40, 4, 2)
    segment_ids = packed(2, 40)
    got = jax.jit(loss_and_grads("pallas", segment_ids))(q, k, v)
    want = jax.jit(loss_and_grads("xla", segment_ids))(q, k, v)
    assert_close(got, want)


@pytest.mark.parametrize("kv_heads", [4, 1], ids=["mha-heads-split", "mqa-kv-repeated"])
def test_pallas_under_mesh_runs_sharded_and_equals_xla(kv_heads):
    """data=2 x tensor=4 mesh: batch over data, heads over tensor, inside shard_map; no all-gather."""
    mesh = jax.make_mesh((2, 1, 1, 4), MESH_AXES, axis_types=(AxisType.Auto,) * 4)
    q, k, v = inputs(2, 32, 4, kv_heads, seed=kv_heads)
    segment_ids = packed(2, 32)
    heads = NamedSharding(mesh, P("data", None, "tensor", None))
    kv = heads if kv_heads == 4 else NamedSharding(mesh, P("data", None, None, None))
    q, k, v = jax.device_put(q, heads), jax.device_put(k, kv), jax.device_put(v, kv)
    segment_ids = jax.device_put(segment_ids, NamedSharding(mesh, P("data", None)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        step = jax.jit(loss_and_grads("pallas", segment_ids))
        hlo = step.lower(q, k, v).compile().as_text()
        got = step(q, k, v)
        want = jax.jit(loss_and_grads("xla", segment_ids))(q, k, v)
    assert "all-gather" not in hlo
    assert got[0][1].sharding.spec[:3] == ("data", None, "tensor")
    assert_close(got, want)


def test_auto_on_cpu_is_xla():
    q, _, _ = inputs(1, 8, 2, 2)
    assert choose_implementation(q, dropout_rate=0.0) == "xla"


@pytest.mark.parametrize(
    "dtype, dropout, expected",
    [(jnp.bfloat16, 0.0, "cudnn"), (jnp.float16, 0.0, "cudnn"), (jnp.float32, 0.0, "xla"),
     (jnp.bfloat16, 0.1, "xla")],
)
def test_auto_on_gpu_follows_the_recorded_table(dtype, dropout, expected):
    query = jnp.zeros((1, 8, 2, 64), dtype)
    with mock.patch.object(attention.jax, "default_backend", lambda: "gpu"):
        assert choose_implementation(query, dropout_rate=dropout) == expected


def test_auto_on_tpu_is_xla_until_measured():
    with mock.patch.object(attention.jax, "default_backend", lambda: "tpu"):
        assert choose_implementation(jnp.zeros((1, 8, 2, 64), jnp.bfloat16), dropout_rate=0.0) == "xla"


def test_dropout_with_pallas_is_refused():
    q, k, v = inputs(1, 8, 2, 2)
    with pytest.raises(ValueError, match="needs implementation='xla'"):
        dot_product_attention(q, k, v, implementation="pallas", dropout_rate=0.1,
                              dropout_rng=jax.random.key(0))


def test_unknown_implementation_is_refused():
    q, k, v = inputs(1, 8, 2, 2)
    with pytest.raises(ValueError, match="'pallas'"):
        dot_product_attention(q, k, v, implementation="flash")
