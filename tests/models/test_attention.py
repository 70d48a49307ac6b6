"""models.attention: implementation choice, and 'pallas' (interpreted) equal to 'xla' with and
without a mesh; sliding windows in 'xla' (against numpy and jax's own local_window_size), in cudnn's call
and in 'pallas'. Tolerance: float32, max abs error 1e-4 on outputs and gradients (O(1) values)."""
import functools
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
from models.kernels import flash_attention as flash_kernels
from models.kernels import flash_attention_tuning as attention_tuning
from models.kernels.flash_attention_tuning import Tuning

MESH_AXES = ("data", "stage", "fsdp", "expert", "tensor")
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


def loss_and_grads(implementation, segment_ids, window=None):
    def loss(q, k, v):
        out = dot_product_attention(q, k, v, causal=True, segment_ids=segment_ids,
                                    implementation=implementation, window=window)
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
    mesh = jax.make_mesh((2, 1, 1, 1, 4), MESH_AXES, axis_types=(AxisType.Auto,) * 5)
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
def test_auto_on_gpu_without_measurements_follows_the_recorded_table(dtype, dropout, expected):
    query = jnp.zeros((1, 8, 2, 64), dtype)
    with mock.patch.object(attention.jax, "default_backend", lambda: "gpu"), \
            mock.patch.object(attention_tuning, "load_table", lambda: ()):
        assert choose_implementation(query, dropout_rate=dropout) == expected


def measured(head_dim, length, fastest, dtype="bfloat16"):
    return {"platform": "gpu", "dtype": dtype, "causal": True, "head_dim": head_dim, "length": length,
            "fastest": fastest, "tuning": Tuning().to_dict()}


MEASURED = (measured(64, 1024, "cudnn"), measured(64, 8192, "pallas"), measured(128, 2048, "xla"))


@pytest.mark.parametrize("head_dim, length, causal, kwargs, expected", [
    (64, 1024, True, {}, "cudnn"),
    (64, 2048, True, {}, "cudnn"),  # nearer 1024 than 8192
    (64, 6000, True, {}, "pallas"),
    (128, 512, True, {}, "xla"),
    (64, 6000, False, {}, "cudnn"),  # not measured bidirectional: the per-dtype choice
    (256, 6000, True, {}, "cudnn"),  # head dim not measured
    (64, 6000, True, {"has_bias": True}, "cudnn"),  # pallas has no bias
    (64, 6000, True, {"cross": True}, "cudnn"),  # nor kv_segment_ids
    (64, 6000, True, {"dropout_rate": 0.1}, "xla"),
])
def test_auto_on_gpu_takes_the_fastest_measured_path_per_shape(head_dim, length, causal, kwargs, expected):
    query = jnp.zeros((1, length, 2, head_dim), jnp.bfloat16)
    with mock.patch.object(attention.jax, "default_backend", lambda: "gpu"), \
            mock.patch.object(attention_tuning, "load_table", lambda: MEASURED):
        assert choose_implementation(query, causal=causal, **{"dropout_rate": 0.0, **kwargs}) == expected


def test_the_measured_table_names_the_fastest_of_its_own_timings():
    """Every entry's 'fastest' is the implementation with the least forward+backward time it recorded, and
    each implementation it names is one 'auto' can run."""
    for entry in attention_tuning.load_table():
        timed = {name: ms for name, ms in entry["fwd_bwd_ms"].items() if ms is not None}
        assert entry["fastest"] == min(timed, key=timed.get), entry
        assert entry["fastest"] in attention.IMPLEMENTATIONS


@pytest.mark.parametrize("dropout, has_bias, expected", [(0.0, False, "splash"), (0.1, False, "xla"),
                                                        (0.0, True, "xla")])
def test_auto_on_tpu_is_splash_unless_dropout_or_a_bias(dropout, has_bias, expected):
    query = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    with mock.patch.object(attention.jax, "default_backend", lambda: "tpu"):
        assert choose_implementation(query, dropout_rate=dropout, has_bias=has_bias) == expected


def test_dropout_with_pallas_is_refused():
    q, k, v = inputs(1, 8, 2, 2)
    with pytest.raises(ValueError, match="needs implementation='xla'"):
        dot_product_attention(q, k, v, implementation="pallas", dropout_rate=0.1,
                              dropout_rng=jax.random.key(0))


def test_unknown_implementation_is_refused():
    q, k, v = inputs(1, 8, 2, 2)
    with pytest.raises(ValueError, match="'pallas'"):
        dot_product_attention(q, k, v, implementation="flash")


def numpy_attention(q, k, v, *, causal, q_segments, kv_segments, bias, scale, window=None):
    """Per (batch, head) loops in float64: softmax(scale * q.k + bias) over the allowed keys (with a
    window, query i sees key j only when i + kv_len - q_len - j < window)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    batch, q_len, heads, _ = q.shape
    kv_len, group = k.shape[1], heads // k.shape[2]
    out = np.zeros_like(q)
    for b in range(batch):
        for h in range(heads):
            logits = scale * q[b, :, h] @ k[b, :, h // group].T + np.asarray(bias[min(b, len(bias) - 1), h])
            allowed = np.ones((q_len, kv_len), bool)
            if causal:
                allowed &= np.tril(np.ones((q_len, kv_len), bool), k=kv_len - q_len)
            if window is not None:
                allowed &= np.triu(np.ones((q_len, kv_len), bool), k=kv_len - q_len - window + 1)
            allowed &= (kv_segments[b] != 0)[None, :]
            if q_segments is not None:
                allowed &= q_segments[b][:, None] == kv_segments[b][None, :]
            for i in range(q_len):
                if allowed[i].any():
                    w = np.exp(logits[i] - logits[i][allowed[i]].max()) * allowed[i]
                    out[b, i, h] = (w / w.sum()) @ v[b, :, h // group]
    return out


@pytest.mark.parametrize("causal, packed_queries, bias_batch", [
    (False, False, 1), (True, True, 2), (False, True, 2)], ids=["cross", "causal-packed", "cross-packed"])
def test_bias_scale_and_cross_lengths_equal_numpy(causal, packed_queries, bias_batch):
    """Queries of length 7 over keys of length 11, 4 query heads over 2 kv heads, scale 1.0 (T5)."""
    q, _, _ = inputs(2, 7, 4, 2, head_dim=8, seed=3)
    _, k, v = inputs(2, 11, 4, 2, head_dim=8, seed=4)
    bias = jax.random.normal(jax.random.key(5), (bias_batch, 4, 7, 11))
    kv_segments = np.array([[1] * 6 + [2] * 4 + [0], [1] * 11])
    q_segments = np.array([[1] * 3 + [2] * 3 + [0], [1] * 7]) if packed_queries else None
    got = jax.jit(functools.partial(dot_product_attention, causal=causal, scale=1.0, implementation="auto"))(
        q, k, v, segment_ids=None if q_segments is None else jnp.asarray(q_segments),
        kv_segment_ids=jnp.asarray(kv_segments), bias=bias)
    want = numpy_attention(q, k, v, causal=causal, q_segments=q_segments, kv_segments=kv_segments,
                           bias=bias, scale=1.0)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_default_scale_and_shared_segment_ids_equal_numpy():
    q, k, v = inputs(2, 9, 2, 2, head_dim=16, seed=6)
    segments = np.asarray(packed(2, 9))
    got = dot_product_attention(q, k, v, causal=True, segment_ids=jnp.asarray(segments), implementation="xla")
    want = numpy_attention(q, k, v, causal=True, q_segments=segments, kv_segments=segments,
                           bias=np.zeros((1, 2, 9, 9)), scale=16**-0.5)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_pallas_takes_a_scale():
    q, k, v = inputs(1, 24, 2, 2, head_dim=8)
    got = dot_product_attention(q, k, v, scale=1.0, implementation="pallas")
    want = dot_product_attention(q, k, v, scale=1.0, implementation="xla")
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)


def test_auto_with_a_bias_picks_a_path_that_has_one():
    query = jnp.zeros((1, 8, 2, 64), jnp.bfloat16)
    with mock.patch.object(attention.jax, "default_backend", lambda: "gpu"), \
            mock.patch.object(attention_tuning, "load_table", lambda: MEASURED):
        assert choose_implementation(query, dropout_rate=0.0, has_bias=True) == "cudnn"
    with mock.patch.dict(attention.AUTO_CHOICES, {("cpu", "any"): "pallas"}):
        assert choose_implementation(query, dropout_rate=0.0, has_bias=True) == "xla"


def test_bias_and_cross_segments_with_pallas_are_refused():
    q, k, v = inputs(1, 8, 2, 2)
    with pytest.raises(ValueError, match="has no bias"):
        dot_product_attention(q, k, v, bias=jnp.zeros((1, 2, 8, 8)), implementation="pallas")
    with pytest.raises(ValueError, match="kv_segment_ids"):
        dot_product_attention(q, k, v, kv_segment_ids=jnp.ones((1, 8), jnp.int32), implementation="pallas")


def test_cross_lengths_need_the_keys_segment_ids():
    q, _, _ = inputs(1, 5, 2, 2)
    _, k, v = inputs(1, 8, 2, 2)
    with pytest.raises(ValueError, match="pass the keys' own kv_segment_ids"):
        dot_product_attention(q, k, v, causal=False, segment_ids=jnp.ones((1, 5), jnp.int32))


@pytest.mark.parametrize("packed_rows", [False, True], ids=["plain", "packed"])
def test_window_in_xla_equals_numpy_and_jax_local_window(packed_rows):
    """12 tokens, window 4, 4 query heads over 2 kv heads; packed: documents of 4 and 3 tokens then padding."""
    q, k, v = inputs(2, 12, 4, 2, head_dim=8, seed=20)
    segments = np.array([[1] * 4 + [2] * 3 + [0] * 5, [1] * 12]) if packed_rows else None
    got = dot_product_attention(q, k, v, segment_ids=None if segments is None else jnp.asarray(segments),
                                window=4, implementation="auto")
    want = numpy_attention(q, k, v, causal=True, q_segments=segments,
                           kv_segments=np.ones((2, 12), int) if segments is None else segments,
                           bias=np.zeros((1, 4, 12, 12)), scale=8**-0.5, window=4)
    mask = None if segments is None else attention.attention_mask(12, 12, causal=False, segment_ids=segments)
    jax_local = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, local_window_size=(3, 0),
                                             implementation="xla")
    real = np.ones((2, 12), bool) if segments is None else segments != 0  # padding rows: jax averages
    np.testing.assert_allclose(np.asarray(got)[real], want[real], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(jax_local)[real], atol=1e-5, rtol=0)
    unwindowed = dot_product_attention(q, k, v, segment_ids=None if segments is None else jnp.asarray(segments))
    assert np.abs(np.asarray(unwindowed - got)[real]).max() > 0.1


@pytest.mark.parametrize("q_len, packed_rows", [(12, True), (5, False)], ids=["self-packed", "5-over-12"])
def test_cudnn_call_with_a_window_means_the_same_to_jax(q_len, packed_rows):
    """cudnn_attention's jax.nn.dot_product_attention call (local_window_size, or our bottom-right mask when
    the query is shorter), run by jax's own XLA implementation, equals 'xla' with the window."""
    q, _, _ = inputs(2, q_len, 4, 2, head_dim=8, seed=21)
    _, k, v = inputs(2, 12, 4, 2, head_dim=8, seed=22)
    segments = jnp.asarray(np.array([[1] * 4 + [2] * 8, [1] * 9 + [0] * 3])) if packed_rows else None
    jax_attention = jax.nn.dot_product_attention
    as_xla = lambda *args, **kwargs: jax_attention(*args, **{**kwargs, "implementation": "xla"})
    with mock.patch.object(attention.jax.nn, "dot_product_attention", side_effect=as_xla) as call:
        got = attention.cudnn_attention(q, k, v, causal=True, segment_ids=segments, window=3)
    assert call.call_args.kwargs["local_window_size"] == ((2, 0) if q_len == 12 else None)
    want = attention.xla_attention(q, k, v, causal=True, segment_ids=segments, window=3)
    real = np.ones((2, q_len), bool) if segments is None else np.asarray(segments) != 0
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5, rtol=0)


def test_pallas_with_a_window_equals_xla():
    """Window 9 over 40 tokens of packed documents, 4 query heads over 2, forward and gradients (the
    kernel's block skipping: tests/models/kernels/test_flash_attention.py)."""
    q, k, v = inputs(2, 40, 4, 2, head_dim=16, seed=23)
    segment_ids = packed(2, 40)
    with mock.patch.object(flash_kernels, "flash_attention", wraps=flash_kernels.flash_attention) as kernel:
        got = jax.jit(loss_and_grads("pallas", segment_ids, window=9))(q, k, v)
    assert kernel.call_args.kwargs["window"] == 9
    assert_close(got, jax.jit(loss_and_grads("xla", segment_ids, window=9))(q, k, v))


@pytest.mark.parametrize("window, causal, message", [
    (4, False, "attention window 4 needs causal=True"), (0, True, "window 0 must be a positive int")])
def test_bad_windows_are_refused_in_one_line(window, causal, message):
    q, k, v = inputs(1, 8, 2, 2)
    for implementation in ("auto", "pallas"):
        with pytest.raises(ValueError, match=message) as error:
            dot_product_attention(q, k, v, causal=causal, window=window, implementation=implementation)
        assert "\n" not in str(error.value)


@pytest.mark.system
def test_a_process_that_runs_no_kernel_imports_no_pallas_kernels():
    """The Pallas kernels (ours and jax's TPU splash kernels, with Pallas's Mosaic and Triton lowerings) load when
    an attention call runs them: a train CLI's process starts 0.5 s of CPU sooner (2.8 -> 2.2 s, measured over five
    runs each of `import t5x_like.train`), and a call that does run them still finds them (the tests above)."""
    import subprocess
    import sys

    from tests.support.environment import cpu_env

    code = ("import sys, t5x_like.train; print(sorted(m for m in sys.modules if m in ('models.kernels.flash_attention', "
            "'models.kernels.splash_attention') or m.startswith(('jax.experimental.pallas.ops', "
            "'jax._src.pallas.mosaic.lowering', 'jax._src.pallas.triton'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cpu_env(1), timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]"], done.stdout
