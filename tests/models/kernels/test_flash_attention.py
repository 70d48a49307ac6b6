"""The Pallas flash-attention kernel (interpreted on CPU) against the plain-jnp reference.

Tolerances (inputs ~N(0, 1), loss sum(sin(out)) so gradients are O(1)):
  float32: max |kernel - reference| <= 1e-4 for the output and every gradient;
  bfloat16: inputs rounded to bf16 for both sides, reference in float32;
            max error <= 3e-2 on the output, <= 6e-2 on the gradients.
assert_allclose fails on any NaN the reference does not have, and every result is checked finite.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.attention import xla_attention
from models.kernels.flash_attention import flash_attention
from models.kernels import flash_attention_tuning as tuning_table
from models.kernels.flash_attention_tuning import KernelTuning, Tuning

TOLERANCE = {jnp.float32: (1e-4, 1e-4), jnp.bfloat16: (3e-2, 6e-2)}


def random_inputs(seed, batch, q_len, kv_len, heads, kv_heads, head_dim, dtype):
    kq, kk, kv = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(kq, (batch, q_len, heads, head_dim), jnp.float32).astype(dtype)
    k = jax.random.normal(kk, (batch, kv_len, kv_heads, head_dim), jnp.float32).astype(dtype)
    v = jax.random.normal(kv, (batch, kv_len, kv_heads, head_dim), jnp.float32).astype(dtype)
    return q, k, v


def packed_segments(seed, batch, length):
    """Sorted document ids 1..3 per row, then a tail of padding (0) in every row."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.integers(1, 4, size=(batch, length)), axis=1)
    for row in ids:
        row[length - rng.integers(1, length // 4 + 2):] = 0
    return jnp.asarray(ids, jnp.int32)


def value_and_grads(attention, q, k, v):
    """Output and d(sum sin(out))/d(q, k, v), all in float32."""

    def loss(q, k, v):
        out = attention(q, k, v).astype(jnp.float32)
        return jnp.sum(jnp.sin(out)), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return [x.astype(jnp.float32) for x in (out, *grads)]


def assert_matches_reference(q, k, v, segment_ids, *, causal, block_q=16, block_k=16, scale=None, window=None,
                             tuning=None):
    tuning = tuning or Tuning.blocks(block_q, block_k)
    kernel = lambda q, k, v: flash_attention(
        q, k, v, segment_ids, causal=causal, scale=scale, tuning=tuning, window=window
    )
    q_scale = 1.0 if scale is None else scale * q.shape[-1] ** 0.5
    reference = lambda q, k, v: xla_attention(
        (q.astype(jnp.float32) * q_scale), k.astype(jnp.float32), v.astype(jnp.float32),
        causal=causal, segment_ids=segment_ids, window=window,
    )
    out_tol, grad_tol = TOLERANCE[q.dtype.type]
    got = value_and_grads(kernel, q, k, v)
    want = value_and_grads(reference, q, k, v)
    for name, g, w, tol in zip(("out", "dq", "dk", "dv"), got, want, (out_tol,) + (grad_tol,) * 3):
        assert np.isfinite(np.asarray(g)).all(), f"{name} has non-finite values"
        np.testing.assert_allclose(g, w, atol=tol, rtol=0, err_msg=name)
    return got


@pytest.mark.parametrize(
    "batch, length, heads, kv_heads, head_dim, causal, segments, block_q, block_k",
    [
        (2, 64, 4, 4, 64, True, False, 16, 32),  # multi-head, several query and key blocks
        (1, 50, 4, 1, 64, True, True, 16, 16),  # multi-query, packed, length padded to 64
        (2, 40, 4, 2, 128, False, True, 32, 16),  # grouped-query, bidirectional, head dim 128
    ],
)
def test_float32_matches_reference(batch, length, heads, kv_heads, head_dim, causal, segments,
                                   block_q, block_k):
    seed = batch * 1000 + length
    q, k, v = random_inputs(seed, batch, length, length, heads, kv_heads, head_dim, jnp.float32)
    segment_ids = packed_segments(seed, batch, length) if segments else None
    assert_matches_reference(q, k, v, segment_ids, causal=causal, block_q=block_q, block_k=block_k)


def test_bfloat16_grouped_packed_matches_reference():
    q, k, v = random_inputs(7, 2, 48, 48, 4, 2, 64, jnp.bfloat16)
    assert_matches_reference(q, k, v, packed_segments(7, 2, 48), causal=True, block_q=16, block_k=16)


@pytest.mark.parametrize("causal", [True, False])
def test_unequal_lengths_align_bottom_right(causal):
    """24 queries over 40 keys: causal rows see keys up to i + 16 (as jnp.tril(k=16))."""
    q, k, v = random_inputs(3, 1, 24, 40, 2, 2, 64, jnp.float32)
    assert_matches_reference(q, k, v, None, causal=causal, block_q=16, block_k=16)


def test_custom_softmax_scale():
    q, k, v = random_inputs(11, 1, 32, 32, 2, 2, 64, jnp.float32)
    assert_matches_reference(q, k, v, None, causal=True, block_q=16, block_k=16, scale=0.05)


def test_fully_masked_rows_give_zero_output_and_gradient():
    """A row of all-padding segment ids, and the padding tail of another: zeros, never NaN."""
    q, k, v = random_inputs(5, 2, 32, 32, 2, 1, 64, jnp.float32)
    segment_ids = jnp.zeros((2, 32), jnp.int32).at[1, :20].set(1)
    out, dq, dk, dv = assert_matches_reference(q, k, v, segment_ids, causal=True, block_q=16, block_k=16)
    np.testing.assert_array_equal(out[0], 0.0)
    np.testing.assert_array_equal(out[1, 20:], 0.0)
    np.testing.assert_array_equal(dq[0], 0.0)
    np.testing.assert_array_equal(dk[0], 0.0)
    np.testing.assert_array_equal(dv[1, 20:], 0.0)


def test_rejects_heads_that_do_not_group():
    q, k, v = random_inputs(0, 1, 16, 16, 3, 2, 64, jnp.float32)
    with pytest.raises(ValueError, match="multiple of the key/value heads"):
        flash_attention(q, k, v)


def test_rejects_segment_ids_of_the_wrong_shape():
    q, k, v = random_inputs(0, 1, 16, 16, 2, 2, 64, jnp.float32)
    with pytest.raises(ValueError, match=r"\[batch, length\]"):
        flash_attention(q, k, v, jnp.ones((1, 8), jnp.int32))


@pytest.mark.parametrize("q_len, kv_len, window, segments, block_q, block_k", [
    (64, 64, 20, False, 16, 32),  # the window's edge inside blocks; key blocks left of it skipped
    (50, 50, 17, True, 16, 16),  # packed, padded to 64
    (24, 40, 9, False, 16, 16),  # bottom-right aligned: query i's keys (i + 16 - 9, i + 16]
    (32, 32, 1, False, 16, 16),  # each token sees only itself
])
def test_sliding_window_matches_reference(q_len, kv_len, window, segments, block_q, block_k):
    q, k, v = random_inputs(window, 2, q_len, kv_len, 4, 2, 32, jnp.float32)
    segment_ids = packed_segments(window, 2, q_len) if segments else None
    assert_matches_reference(q, k, v, segment_ids, causal=True, block_q=block_q, block_k=block_k, window=window)


def windowed_grads(q, k, v, rows):
    """Output and gradients of sum(out[:, rows]) with window 16 in blocks of 16."""
    def loss(q, k, v):
        out = flash_attention(q, k, v, causal=True, window=16, tuning=Tuning.blocks(16, 16))
        return jnp.sum(out[:, rows]), out

    (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return [np.asarray(x) for x in (out, *grads)]


def test_sliding_window_skips_blocks_wholly_outside_it():
    """64 tokens in blocks of 16, window 16, so query block i reads key blocks i - 1 and i. A block the
    kernels read, even masked, spreads NaN (0 * NaN): NaN values in key block 0 leave query block 2's output
    and dQ finite; NaN queries in block 3 leave key blocks 0 and 1's dK/dV finite. The blocks that read
    them turn NaN, so the check can fail."""
    q, k, v = random_inputs(1, 1, 64, 64, 2, 2, 32, jnp.float32)
    out, dq, _, _ = windowed_grads(q, k, v.at[:, :16].set(jnp.nan), slice(32, 48))
    assert np.isfinite(out[:, 32:]).all() and np.isfinite(dq[:, 32:48]).all() and np.isnan(out[:, :32]).all()
    _, _, dk, dv = windowed_grads(q.at[:, 48:].set(jnp.nan), k, v, slice(0, 48))
    assert np.isfinite(dk[:, :32]).all() and np.isfinite(dv[:, :32]).all() and np.isnan(dk[:, 32:]).all()


# ----------------------------------------------------------------------------- tuning: per-kernel launch settings


MIXED = Tuning(forward=KernelTuning(32, 16), dq=KernelTuning(16, 32, num_stages=3), dkv=KernelTuning(16, 64))


@pytest.mark.parametrize("q_len, kv_len, window, segments", [
    (100, 100, None, True),  # packed, padded to 128: every kernel's blocks divide it
    (48, 80, None, False),  # bottom-right aligned, each axis padded to its own blocks
    (96, 96, 20, False),  # a window's edge inside the blocks of every kernel
])
def test_each_kernel_may_have_its_own_blocks(q_len, kv_len, window, segments):
    q, k, v = random_inputs(q_len + kv_len, 2, q_len, kv_len, 4, 2, 32, jnp.float32)
    segment_ids = packed_segments(q_len, 2, q_len) if segments else None
    assert_matches_reference(q, k, v, segment_ids, causal=True, window=window, tuning=MIXED)


def table_tunings():
    """Every distinct (tuning, head dim) of the measured table, so each is checked in interpret mode."""
    seen = {}
    for entry in tuning_table.load_table():
        tuning = Tuning.from_dict(entry["tuning"])
        seen.setdefault((tuning, entry["head_dim"]), f"{entry['dtype']} D={entry['head_dim']} T={entry['length']}")
    return [pytest.param(tuning, head_dim, id=name) for (tuning, head_dim), name in seen.items()]


@pytest.mark.parametrize("tuning, head_dim", table_tunings() or [pytest.param(Tuning(), 64, id="defaults")])
def test_every_tuning_of_the_table_matches_reference(tuning, head_dim):
    """Each measured launch (blocks up to 128) on a length that pads and spans several blocks, grouped heads."""
    q, k, v = random_inputs(head_dim, 1, 200, 200, 2, 1, head_dim, jnp.float32)
    assert_matches_reference(q, k, v, None, causal=True, tuning=tuning)


def test_the_table_picks_the_nearest_measured_length():
    entries = tuple({"platform": "gpu", "dtype": "bfloat16", "causal": True, "head_dim": 64, "length": length,
                     "fastest": name, "tuning": Tuning.blocks(16 * i, 16).to_dict()}
                    for i, (length, name) in enumerate([(1024, "cudnn"), (4096, "pallas")], start=1))
    near = lambda length, **kw: tuning_table.nearest_entry(**{"platform": "gpu", "dtype": "bfloat16", "causal": True,
                                                             "head_dim": 64, **kw}, length=length, entries=entries)
    assert near(512)["length"] == near(1500)["length"] == 1024
    assert near(3000)["length"] == near(65536)["length"] == 4096
    assert near(2048)["length"] == 4096  # halfway in log scale: the longer one
    assert near(1024, head_dim=128) is None and near(1024, dtype="float32") is None
    assert near(1024, platform="tpu") is None


@pytest.mark.parametrize("bad, match", [
    (dict(block_q=96), "power of two"), (dict(block_k=8), "power of two"),
    (dict(num_warps=3), "num_warps"), (dict(num_stages=0), "num_stages"),
])
def test_kernel_tuning_rejects_bad_settings(bad, match):
    with pytest.raises(ValueError, match=match):
        KernelTuning(**bad)


FUSED = Tuning(forward=KernelTuning(32, 16), dkv=KernelTuning(16, 32), backward="fused")


@pytest.mark.parametrize("q_len, kv_len, kv_heads, window, segments", [
    (100, 100, 2, None, True),  # packed and padded, two query heads per KV head add into one dQ block each
    (48, 80, 4, None, False),  # bottom-right aligned
    (96, 96, 1, 20, False),  # multi-query with a window
])
def test_the_fused_backward_matches_reference(q_len, kv_len, kv_heads, window, segments):
    """One backward kernel over key blocks that adds every query block's dQ share atomically (interpret mode)."""
    q, k, v = random_inputs(q_len * kv_heads, 2, q_len, kv_len, 4, kv_heads, 32, jnp.float32)
    segment_ids = packed_segments(q_len, 2, q_len) if segments else None
    assert_matches_reference(q, k, v, segment_ids, causal=True, window=window, tuning=FUSED)


def test_the_fused_backward_in_bfloat16_matches_reference():
    q, k, v = random_inputs(9, 2, 64, 64, 4, 2, 64, jnp.bfloat16)
    assert_matches_reference(q, k, v, packed_segments(9, 2, 64), causal=True, tuning=FUSED)


def test_an_unknown_backward_is_refused():
    with pytest.raises(ValueError, match="backward='atomic'"):
        Tuning(backward="atomic")
