"""TPU attention: jax's splash-attention kernels behind models.attention ('splash', and 'auto' on TPU).

On CPU the model path runs the kernels in Pallas' HLO interpreter; one test runs them per example in
jax's TPU interpret mode (`pltpu.InterpretParams`, the TPU emulator) as well. Tolerances: float32, the largest
absolute difference over the largest absolute reference value <= 1e-5, for outputs and gradients;
bfloat16 inputs, against the float32 reference on the same (rounded) inputs: <= 2e-2, and at most 2x
what plain XLA attention reaches in bfloat16. The libtpu tests compile for a v5p topology (no chips
needed) and skip where libtpu is not installed (`make libtpu-venv`, then `make test-libtpu`).
"""
import importlib.util
import os
from unittest import mock

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from models import attention
from models.attention import dot_product_attention
from models.kernels import splash_attention as splash
from t5x_like.features import DECODER_POSITIONS, DECODER_SEGMENT_IDS

MESH_AXES = ("data", "stage", "fsdp", "expert", "tensor")
RULES = [("activation_batch", ("data", "fsdp")), ("activation_heads", "tensor"),
         ("activation_length", None), ("activation_kv", None)]
BLOCKS_OF_128 = splash.BlockSizes(block_q=128, block_kv=128, block_kv_compute=128, block_q_dkv=128,
                                  block_kv_dkv=128, block_kv_dkv_compute=128, block_q_dq=128, block_kv_dq=128)
"""Smaller than block_sizes_for picks at 256 tokens, so a causal mask has a skipped block, masked
diagonal blocks and a full one, in every kernel."""


def inputs(batch, length, heads, kv_heads, head_dim, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    return tuple(jax.random.normal(key, (batch, length, h, head_dim)).astype(dtype)
                 for key, h in zip(keys, (heads, kv_heads, kv_heads)))


def packed(batch, length):
    """Two documents per row then padding (segment id 0), the first boundary inside a 128-block."""
    ids = np.ones((batch, length), np.int32)
    ids[:, 90:] = 2
    ids[:, -9:] = 0
    return jnp.asarray(ids)


def loss_and_grads(implementation, segment_ids, causal=True, block_sizes=None, window=None):
    def loss(q, k, v):
        out = dot_product_attention(q, k, v, causal=causal, segment_ids=segment_ids,
                                    implementation=implementation, block_sizes=block_sizes, window=window)
        return jnp.sum(jnp.sin(out.astype(jnp.float32))), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))


def relative_errors(got, want):
    """max |got - want| / max |want| for the output and each gradient."""
    (_, got_out), got_grads = got
    (_, want_out), want_grads = want
    errors = []
    for g, w in zip((got_out, *got_grads), (want_out, *want_grads)):
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        assert np.isfinite(g).all()
        errors.append(float(np.abs(g - w).max() / np.abs(w).max()))
    return errors


@pytest.mark.parametrize("batch, heads, kv_heads, head_dim, causal, segments", [
    (1, 2, 2, 64, True, False),
    (1, 4, 2, 128, True, True),
    (1, 2, 1, 64, False, True),
], ids=["causal-mha-d64", "causal-packed-gqa-d128", "bidirectional-packed-mqa-d64"])
def test_splash_equals_xla_forward_and_gradients(batch, heads, kv_heads, head_dim, causal, segments):
    """Length 256 in blocks of 128: the causal mask skips a block and masks the diagonal ones."""
    q, k, v = inputs(batch, 256, heads, kv_heads, head_dim, seed=heads + head_dim)
    segment_ids = packed(batch, 256) if segments else None
    got = loss_and_grads("splash", segment_ids, causal, BLOCKS_OF_128)(q, k, v)
    want = loss_and_grads("xla", segment_ids, causal)(q, k, v)
    assert max(relative_errors(got, want)) <= 1e-5
    if segments:  # padding rows: output and gradient exactly zero, as in 'xla'
        assert not np.asarray(got[0][1])[:, -9:].any() and not np.asarray(got[1][0])[:, -9:].any()


def test_kernels_in_tpu_interpret_mode_equal_xla():
    """jax's TPU emulator, one example per call (jax 0.10.2's emulator takes no vmapped grid): causal,
    packed documents with padding, GQA 4 over 2, blocks of 128 over 256 tokens; forward and gradients."""
    q, k, v = inputs(1, 256, 4, 2, 64, seed=3)
    segment_ids = packed(1, 256)
    kernel = splash.make_kernel(4, 256, causal=True, block_sizes=BLOCKS_OF_128, interpret=pltpu.InterpretParams())

    def loss(q, k, v):
        def one_example(args):
            q1, k1, v1, s1 = (jnp.swapaxes(x, 0, 1) if x.ndim == 3 else x for x in args)
            return jnp.swapaxes(kernel(q1 * 64**-0.5, k1, v1, segment_ids=splash.splash.SegmentIds(s1, s1)), 0, 1)

        out = jax.lax.map(one_example, (q, k, v, segment_ids))
        out = jnp.where((segment_ids != 0)[:, :, None, None], out, 0.0)
        return jnp.sum(jnp.sin(out)), out

    got = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    assert max(relative_errors(got, loss_and_grads("xla", segment_ids)(q, k, v))) <= 1e-5


def test_splash_in_bfloat16_is_as_close_as_xla():
    q, k, v = inputs(1, 256, 2, 1, 128, dtype=jnp.bfloat16, seed=1)
    segment_ids = packed(1, 256)
    reference = loss_and_grads("xla", segment_ids)(*(x.astype(jnp.float32) for x in (q, k, v)))
    splash_errors = relative_errors(loss_and_grads("splash", segment_ids, block_sizes=BLOCKS_OF_128)(q, k, v),
                                    reference)
    xla_errors = relative_errors(loss_and_grads("xla", segment_ids)(q, k, v), reference)
    assert max(splash_errors) <= 2e-2
    for s, x in zip(splash_errors, xla_errors):
        assert s <= 2 * x


def test_splash_under_mesh_runs_per_shard_and_equals_xla(kv_heads=1):
    """data=2 x tensor=2 mesh: batch over data, heads over tensor, inside shard_map; no all-gather.
    One K/V head (MQA) is repeated to one per tensor shard."""
    mesh = jax.make_mesh((2, 1, 1, 1, 2), MESH_AXES, axis_types=(AxisType.Auto,) * 5, devices=jax.devices()[:4])
    q, k, v = inputs(2, 128, 4, kv_heads, 64, seed=kv_heads)
    heads = NamedSharding(mesh, P("data", None, "tensor", None))
    kv = NamedSharding(mesh, P("data", None, None, None))
    q, k, v = jax.device_put(q, heads), jax.device_put(k, kv), jax.device_put(v, kv)
    segment_ids = jax.device_put(packed(2, 128), NamedSharding(mesh, P("data", None)))
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        step = loss_and_grads("splash", segment_ids)
        hlo = step.lower(q, k, v).compile().as_text()
        got = step(q, k, v)
        want = loss_and_grads("xla", segment_ids)(q, k, v)
    assert "all-gather" not in hlo
    assert got[0][1].sharding.spec[:3] == ("data", None, "tensor")
    assert max(relative_errors(got, want)) <= 1e-5


@pytest.mark.parametrize("kv_heads, shards, repeats", [(8, 4, 1), (2, 4, 2), (1, 4, 4), (2, 1, 1), (4, 8, 2)])
def test_kv_heads_are_repeated_just_enough_to_split(kv_heads, shards, repeats):
    key = jnp.arange(kv_heads, dtype=jnp.float32).reshape(1, 1, kv_heads, 1)
    key, _ = attention.repeat_kv_heads(key, key, 8, shards)
    assert key.shape[2] == kv_heads * repeats
    # query head h still reads K/V head h // (8 // kv_heads), now at index h // (8 // key.shape[2])
    for h in range(8):
        assert key[0, 0, h // (8 // key.shape[2]), 0] == h // (8 // kv_heads)


def test_causal_mask_is_block_sparse():
    """4 x 4 blocks of 128: the 6 above the diagonal are skipped, the 4 on it masked, 6 below full."""
    blocks_of_128 = splash.BlockSizes(block_q=128, block_kv=128)
    kernel = splash.make_kernel(1, 512, causal=True, block_sizes=blocks_of_128, interpret=True)
    kinds, counts = np.unique(np.asarray(kernel.fwd_mask_info.block_mask), return_counts=True)
    assert dict(zip(kinds.tolist(), counts.tolist())) == {0: 6, 1: 4, 2: 6}


def test_sliding_window_equals_xla_and_skips_blocks_left_of_it():
    """Window 100 over 256 tokens in blocks of 128 (the window's edge inside a block), packed documents, GQA
    4 over 2: forward and gradients equal 'xla'. Over 512 tokens each query block reads only its own key
    block and the one before (7 partial blocks of 16; causal reads 10)."""
    q, k, v = inputs(1, 256, 4, 2, 64, seed=12)
    segment_ids = packed(1, 256)
    got = loss_and_grads("splash", segment_ids, block_sizes=BLOCKS_OF_128, window=100)(q, k, v)
    want = loss_and_grads("xla", segment_ids, window=100)(q, k, v)
    assert max(relative_errors(got, want)) <= 1e-5
    assert max(relative_errors(loss_and_grads("xla", segment_ids)(q, k, v), want)) > 1e-2  # the window matters
    kernel = splash.make_kernel(1, 512, causal=True, block_sizes=splash.BlockSizes(block_q=128, block_kv=128),
                                interpret=True, window=100)
    info = kernel.fwd_mask_info
    np.testing.assert_array_equal(np.asarray(info.data_next)[0], [[0, 0], [0, 1], [1, 2], [2, 3]])
    np.testing.assert_array_equal(np.asarray(info.block_mask)[0], [[1, 0], [1, 1], [1, 1], [1, 1]])


@pytest.mark.parametrize("length, block", [(2048, 512), (32768, 512), (768, 256), (384, 128), (128, 128)])
def test_block_sizes_follow_the_length(length, block):
    sizes = splash.block_sizes_for(length, length)
    assert (sizes.block_q, sizes.block_kv, sizes.block_q_dkv, sizes.block_kv_dq) == (block,) * 4


def test_block_sizes_refuse_lengths_off_the_lanes():
    with pytest.raises(ValueError, match="multiples of 128; got 200.*implementation 'xla'"):
        splash.block_sizes_for(200, 200)


def test_block_sizes_can_be_overridden():
    q, k, v = inputs(1, 256, 2, 2, 64, seed=7)
    chosen = splash.BlockSizes(block_q=256, block_kv=128, block_kv_compute=128, block_q_dkv=256,
                               block_kv_dkv=128, block_kv_dkv_compute=128, block_q_dq=256, block_kv_dq=128)
    with mock.patch.object(splash, "make_kernel", wraps=splash.make_kernel) as make_kernel:
        got = dot_product_attention(q, k, v, implementation="splash", block_sizes=chosen)
    assert make_kernel.call_args.kwargs["block_sizes"] is chosen
    want = dot_product_attention(q, k, v, implementation="xla")
    assert np.abs(np.asarray(got - want)).max() <= 1e-5 * np.abs(np.asarray(want)).max()


def test_shapes_splash_cannot_serve_run_in_xla_logged_once():
    """Length 200 (not a multiple of 128): 'splash' runs XLA attention, with one warning for two calls."""
    q, k, v = inputs(1, 200, 2, 2, 64, seed=8)
    attention._LOGGED_FALLBACKS.clear()
    with mock.patch.object(attention.logging, "warning") as warning, \
            mock.patch.object(attention, "splash_attention") as kernel:
        got = [dot_product_attention(q, k, v, implementation="splash") for _ in range(2)]
    kernel.assert_not_called()
    assert warning.call_count == 1 and "length 200 is not a multiple of 128" in warning.call_args.args[1]
    np.testing.assert_array_equal(got[0], dot_product_attention(q, k, v, implementation="xla"))


def test_t5_attention_on_tpu_runs_xla_and_stays_exact():
    """What runs for T5 on TPU: self-attention with the relative-position bias and cross-attention
    (other key length, the keys' own segment ids) both take XLA attention under 'auto'."""
    q, k, v = inputs(2, 128, 4, 4, 64, seed=9)
    _, ck, cv = inputs(2, 256, 4, 4, 64, seed=10)
    bias = jax.random.normal(jax.random.key(11), (1, 4, 128, 128))
    kv_segments = jnp.asarray(np.r_[np.ones(200), np.zeros(56)].astype(np.int32)[None].repeat(2, 0))
    with mock.patch.object(attention.jax, "default_backend", lambda: "tpu"), \
            mock.patch.object(attention, "splash_attention") as kernel:
        self_out = dot_product_attention(q, k, v, causal=False, bias=bias, scale=1.0)
        cross_out = dot_product_attention(q, ck, cv, causal=False, kv_segment_ids=kv_segments, scale=1.0)
    kernel.assert_not_called()
    np.testing.assert_array_equal(self_out, attention.xla_attention(q, k, v, causal=False, segment_ids=None,
                                                                    bias=bias, scale=1.0))
    np.testing.assert_array_equal(cross_out, attention.xla_attention(
        q, ck, cv, causal=False, segment_ids=None, kv_segment_ids=kv_segments, scale=1.0))


@pytest.fixture
def quickstart_losses(synthetic_source):
    """Losses of two train steps of quickstart.gin (GPT-2 tiny, fp32) at 128 tokens with packed
    rows, on a data=2 x tensor=2 mesh, for one ATTENTION value."""
    from t5x_like import compile as compile_tool
    from t5x_like.config import frontend
    from t5x_like.experiment import build_experiment

    def run(implementation, steps=2):
        gin.clear_config()
        settings = frontend.parse_gin(["quickstart.gin"], [
            *compile_tool.UNUSED_MACROS, "BATCH_SIZE=4", "SEQ_LEN=128", "DATA_PARALLEL=2", "TENSOR_PARALLEL=2",
            f"ATTENTION='{implementation}'"], [])
        exp = build_experiment(settings.experiment, train_steps=settings.loop.train_steps,
                               mesh=compile_tool.mesh_for(jax.devices()[:4], settings))
        state = exp.init_state()
        source = synthetic_source("train", batch_size=4, feature_lengths={"targets": 128}, seed=0,
                                  shard_index=0, shard_count=1)
        losses = []
        with exp.partitioner.activate(), mock.patch.object(splash, "splash_attention",
                                                            wraps=splash.splash_attention) as kernel:
            for _ in range(steps):
                local = next(source)
                local[DECODER_SEGMENT_IDS] = np.asarray(packed(4, 128))
                local[DECODER_POSITIONS] = np.r_[np.arange(90), np.arange(38)][None].repeat(4, 0).astype(np.int32)
                state, metrics = exp.train_step(state, exp.global_batch(local))
                losses.append(float(metrics["loss"]))
        assert kernel.called == (implementation == "splash")
        return losses

    yield run
    gin.clear_config()


@pytest.mark.integration
def test_quickstart_trains_the_same_with_splash_as_with_xla(quickstart_losses):
    splash_losses, xla_losses = quickstart_losses("splash"), quickstart_losses("xla")
    print("losses, splash:", splash_losses, "xla:", xla_losses)
    assert splash_losses[-1] < splash_losses[0]  # it trains
    np.testing.assert_allclose(splash_losses, xla_losses, rtol=1e-5)


# ------------------------------------------------------------------ compiled by libtpu for a v5p slice

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="libtpu is not installed here: `make libtpu-venv` creates .venv-libtpu, `make test-libtpu` runs these")


@pytest.fixture
def v5p_compile():
    """Compile one train step of quickstart.gin's GPT-2 tiny (4 heads of 64) for v5p:2x2x1 (4 chips,
    data parallel), 4 sequences of `length` tokens in bf16: (report, compiled executable)."""
    from t5x_like import compile as compile_tool
    from t5x_like.config import frontend

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    devices = compile_tool.target_devices("v5p:2x2x1")

    def run(implementation, length, gin_file="quickstart.gin", overrides=""):
        gin.clear_config()
        settings = frontend.parse_gin([gin_file], [
            *compile_tool.UNUSED_MACROS, "BATCH_SIZE=4", f"SEQ_LEN={length}", "DTYPE='bfloat16'",
            f"ATTENTION='{implementation}'", f"model_config.overrides={{'max_len': {length}{overrides}}}"], [])
        return compile_tool.compile_step(devices, compile_tool.device_memory(devices, None), settings)

    yield run
    gin.clear_config()


@needs_libtpu
def test_auto_on_v5p_compiles_the_splash_kernels_with_far_less_memory(v5p_compile):
    auto_report, auto_compiled = v5p_compile("auto", 2048)
    xla_report, xla_compiled = v5p_compile("xla", 2048)
    assert auto_report["device_kind"] == "TPU v5"
    assert "tpu_custom_call" in auto_compiled.as_text() and "splash" in auto_compiled.as_text()
    assert "tpu_custom_call" not in xla_compiled.as_text()
    assert auto_report["temp_bytes_per_device"] <= xla_report["temp_bytes_per_device"] / 2


@needs_libtpu
def test_a_sliding_window_on_v5p_compiles_the_splash_kernels_with_its_local_mask(v5p_compile):
    """Mistral's sliding window (the tiny Llama with a 512-token window over 2048) compiled by libtpu: 'auto'
    runs splash with the window's LocalMask in the kernels, in less memory than XLA's windowed T x T scores."""
    window = dict(gin_file="quickstart_llama.gin", overrides=", 'sliding_window': 512")
    auto_report, auto_compiled = v5p_compile("auto", 2048, **window)
    xla_report, _ = v5p_compile("xla", 2048, **window)
    assert auto_report["device_kind"] == "TPU v5"
    assert "tpu_custom_call" in auto_compiled.as_text() and "splash" in auto_compiled.as_text()
    assert auto_report["temp_bytes_per_device"] < xla_report["temp_bytes_per_device"]
