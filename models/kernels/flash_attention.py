"""Flash attention in Pallas: forward and backward, causal (optionally a sliding window), packed segments,
grouped KV heads.

One kernel source in the portable `pl.pallas_call` grid style. It lowers through Triton on GPU
(while the installed jax ships `jax.experimental.pallas.triton`), through Mosaic on TPU, and runs
with `interpret=True` on CPU (chosen automatically there), so CPU tests exercise the real kernels.

Layout inside the kernels is [batch, heads, length, head_dim]; `flash_attention` takes and returns
BTNH like `jax.nn.dot_product_attention` and transposes at the boundary. Lengths that are not a
multiple of the block size are padded and the padded keys masked inside the kernel.

The algorithm is FlashAttention-2: the forward pass walks the key blocks of one query block with an
online softmax and saves the log-sum-exp per query row; the backward pass recomputes the
probabilities block by block from it, in two kernels (dK/dV over key blocks, dQ over query blocks;
the kernels themselves are in flash_attention_kernels.py),
so no [length, length] matrix ever reaches HBM. A query row with no allowed key (segment id 0, or a
causal row before the first key) gets output 0 and gradient 0. With a sliding window the kernels walk only
the key blocks (query blocks, for dK/dV) that overlap it and mask inside the blocks on its edges.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from models.kernels.flash_attention_kernels import Config, dkv_kernel, dq_kernel, forward_kernel
from models.kernels.flash_attention_tuning import Tuning, tuning_for
from models.kernels.window import check_window

try:  # Deprecated since jax 0.11 in favour of Mosaic GPU; without it GPU 'pallas' raises.
    from jax.experimental.pallas import triton as pl_triton
except ImportError:  # pragma: no cover - depends on the installed jax
    pl_triton = None


def compiler_params(cfg: Config):
    """Backend-specific launch settings for the current default backend (None on CPU/interpret)."""
    backend = jax.default_backend()
    if backend == "tpu":
        from jax.experimental.pallas import tpu as pltpu

        return pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "parallel"))
    if backend == "gpu":
        if pl_triton is None:
            raise NotImplementedError(
                f"jax {jax.__version__} has no Triton Pallas lowering, which the portable flash "
                "attention kernel needs on GPU; use attention implementation 'cudnn' or 'xla'."
            )
        return pl_triton.CompilerParams(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return None


def call(kernel, cfg: Config, grid, in_specs, out_specs, out_shape, *args, name=None, aliases=None, **options):
    return pl.pallas_call(
        functools.partial(kernel, cfg=cfg, **options),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=cfg.interpret,
        compiler_params=None if cfg.interpret else compiler_params(cfg),
        input_output_aliases=aliases or {},
        name=name or kernel.__name__,
    )(*args)


def segment_layouts(segment_ids):
    """Segment ids as columns [B, T, 1] and rows [B, 1, T], so kernels never transpose them."""
    return segment_ids[:, :, None], segment_ids[:, None, :]


def segment_specs_per_query_block(cfg: Config):
    """Block specs of segment_layouts for a (batch, head, query block) grid: the block's column,
    and the whole key row."""
    return [
        pl.BlockSpec((None, cfg.block_q, 1), lambda b, h, i: (b, i, 0)),
        pl.BlockSpec((None, 1, cfg.padded_kv), lambda b, h, i: (b, 0, 0)),
    ]


def forward(cfg: Config, q, k, v, segment_ids):
    """q [B,H,Tq,D], k/v [B,Hkv,Tk,D] (padded) -> out [B,H,Tq,D], lse [B,H,Tq,1] fp32."""
    batch, heads, _, head_dim = q.shape
    bq, group = cfg.block_q, cfg.group
    grid = (batch, heads, cfg.padded_q // bq)
    in_specs = [
        pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i: (b, h, i, 0)),
        pl.BlockSpec((None, None, cfg.padded_kv, head_dim), lambda b, h, i: (b, h // group, 0, 0)),
        pl.BlockSpec((None, None, cfg.padded_kv, head_dim), lambda b, h, i: (b, h // group, 0, 0)),
    ]
    args = [q, k, v]
    if cfg.has_segments:
        in_specs += segment_specs_per_query_block(cfg)
        args += segment_layouts(segment_ids)
    out_specs = [
        pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i: (b, h, i, 0)),
        pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0)),
    ]
    out_shape = [
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct((batch, heads, cfg.padded_q, 1), jnp.float32),
    ]
    return call(forward_kernel, cfg, grid, in_specs, out_specs, out_shape, *args)


def backward_dq(cfg: Config, q, k, v, do, lse, delta, segment_ids):
    batch, heads, _, head_dim = q.shape
    bq, group = cfg.block_q, cfg.group
    q_block = pl.BlockSpec((None, None, bq, head_dim), lambda b, h, i: (b, h, i, 0))
    kv_full = pl.BlockSpec((None, None, cfg.padded_kv, head_dim), lambda b, h, i: (b, h // group, 0, 0))
    column = pl.BlockSpec((None, None, bq, 1), lambda b, h, i: (b, h, i, 0))
    in_specs = [q_block, kv_full, kv_full, q_block, column, column]
    args = [q, k, v, do, lse, delta]
    if cfg.has_segments:
        in_specs += segment_specs_per_query_block(cfg)
        args += segment_layouts(segment_ids)
    grid = (batch, heads, cfg.padded_q // bq)
    out_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
    return call(dq_kernel, cfg, grid, in_specs, q_block, out_shape, *args)


def backward_dkv(cfg: Config, q, k, v, do, lse, delta, segment_ids, *, fused: bool = False):
    """dK, dV; with `fused`, also dQ (float32, summed atomically over key blocks with Triton's atomic add, which
    interpret mode runs too)."""
    batch, kv_heads, _, head_dim = k.shape
    bk, group = cfg.block_k, cfg.group
    q_group = pl.BlockSpec((None, group, cfg.padded_q, head_dim), lambda b, h, j: (b, h, 0, 0))
    row_group = pl.BlockSpec((None, group, 1, cfg.padded_q), lambda b, h, j: (b, h, 0, 0))
    kv_block = pl.BlockSpec((None, None, bk, head_dim), lambda b, h, j: (b, h, j, 0))
    in_specs = [q_group, kv_block, kv_block, q_group, row_group, row_group]
    args = [q, k, v, do, lse, delta]
    if cfg.has_segments:
        in_specs += [
            pl.BlockSpec((None, 1, cfg.padded_q), lambda b, h, j: (b, 0, 0)),
            pl.BlockSpec((None, bk, 1), lambda b, h, j: (b, j, 0)),
        ]
        args += segment_layouts(segment_ids)[::-1]
    grid = (batch, kv_heads, cfg.padded_kv // bk)
    out_specs = [kv_block, kv_block]
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    if not fused:
        return call(dkv_kernel, cfg, grid, in_specs, out_specs, out_shape, *args)
    if pl_triton is None:
        raise NotImplementedError(f"the fused attention backward needs Triton's atomic add, which jax {jax.__version__} "
                                  "does not ship; tune with backward='split'.")
    dq_zeros = jnp.zeros(q.shape, jnp.float32)
    return call(dkv_kernel, cfg, grid, [*in_specs, q_group], [*out_specs, q_group],
                [*out_shape, jax.ShapeDtypeStruct(q.shape, jnp.float32)], *args, dq_zeros,
                name="dkv_dq_kernel", aliases={len(args): 2}, atomic_add=pl_triton.atomic_add)


class KernelConfigs(NamedTuple):
    """The Config of each kernel of one call (same shape and masks, each kernel's own blocks and launch)."""

    forward: Config
    dq: Config
    dkv: Config
    fused_backward: bool = False  # one backward kernel over key blocks (dkv's launch) that also adds up dQ


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def attention_bhtd(cfgs: KernelConfigs, q, k, v, segment_ids):
    return forward(cfgs.forward, q, k, v, segment_ids)[0]


def attention_bhtd_fwd(cfgs: KernelConfigs, q, k, v, segment_ids):
    out, lse = forward(cfgs.forward, q, k, v, segment_ids)
    return out, (q, k, v, segment_ids, out, lse)


def attention_bhtd_bwd(cfgs: KernelConfigs, residuals, do):
    q, k, v, segment_ids, out, lse = residuals
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    as_rows = lambda x: jnp.swapaxes(x, 2, 3)  # [B,H,T,1] -> [B,H,1,T], same bytes
    if cfgs.fused_backward:
        dk, dv, dq = backward_dkv(cfgs.dkv, q, k, v, do, as_rows(lse), as_rows(delta), segment_ids, fused=True)
        return dq.astype(q.dtype), dk, dv, None
    dq = backward_dq(cfgs.dq, q, k, v, do, lse, delta, segment_ids)
    dk, dv = backward_dkv(cfgs.dkv, q, k, v, do, as_rows(lse), as_rows(delta), segment_ids)
    return dq, dk, dv, None


attention_bhtd.defvjp(attention_bhtd_fwd, attention_bhtd_bwd)


# ----------------------------------------------------------------------------- public entry point


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def pick_block(length: int, block: int) -> int:
    """The requested block, or the length rounded up to a power of two (>= 16) when shorter.

    Triton needs power-of-two tiles and 16-wide matmuls; Mosaic TPU needs a tile that is the whole
    (padded) dimension when it is not a multiple of 128.
    """
    return min(block, max(16, pl.next_power_of_2(length)))


def pad_length(x, length: int, axis: int):
    if x.shape[axis] == length:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, widths)


def kernel_configs(tuning: Tuning, *, q_len: int, kv_len: int, head_dim: int, has_segments: bool,
                   **shape) -> KernelConfigs:
    """Each kernel's Config: its blocks (shortened to short lengths) and launch, with one padded length per
    axis that every kernel's blocks divide (with segments, one length for both axes)."""
    kernels = (tuning.forward, tuning.dq, tuning.dkv)
    blocks = [(pick_block(q_len, t.block_q), pick_block(kv_len, t.block_k)) for t in kernels]
    q_multiple, kv_multiple = math.lcm(*(bq for bq, _ in blocks)), math.lcm(*(bk for _, bk in blocks))
    padded_q, padded_kv = round_up(q_len, q_multiple), round_up(kv_len, kv_multiple)
    if has_segments:  # one padded length serves both the query and key layouts
        padded_q = padded_kv = round_up(q_len, math.lcm(q_multiple, kv_multiple))
    return KernelConfigs(*(
        Config(q_len=q_len, kv_len=kv_len, padded_q=padded_q, padded_kv=padded_kv, has_segments=has_segments,
               block_q=bq, block_k=bk, num_warps=t.warps(head_dim), num_stages=t.num_stages, **shape)
        for t, (bq, bk) in zip(kernels, blocks)
    ), fused_backward=tuning.backward == "fused")


def flash_attention(query: jax.Array, key: jax.Array, value: jax.Array, segment_ids: jax.Array | None = None, *,
                    causal: bool = True, scale: float | None = None, window: int | None = None,
                    tuning: Tuning | None = None, interpret: bool | None = None) -> jax.Array:
    """Fused attention over BTNH inputs; key/value may have fewer heads (GQA / MQA).

    segment_ids: int [batch, length] (needs equal query and key lengths); 0 marks padding, which
    attends nowhere (output 0) and is attended by nobody. scale defaults to head_dim ** -0.5.
    window: causal sliding window (needs causal=True): query i sees key j iff 0 <= i + kv_len - q_len - j <
    window; None: no window. tuning: the kernels' blocks and launch settings; None reads the measured
    table (flash_attention_tuning) for this backend and shape. interpret: None runs interpreted on CPU
    and compiled elsewhere.
    """
    batch, q_len, heads, head_dim = query.shape
    kv_len, kv_heads = key.shape[1], key.shape[2]
    if heads % kv_heads:
        raise ValueError(
            f"query has {heads} heads, key/value {kv_heads}: the query heads must be a multiple "
            "of the key/value heads (grouped-query attention)."
        )
    if segment_ids is not None and segment_ids.shape != (batch, q_len) or (
        segment_ids is not None and kv_len != q_len
    ):
        raise ValueError(
            f"segment_ids has shape {None if segment_ids is None else segment_ids.shape}; it must "
            f"be [batch, length] = {(batch, q_len)} with key length {kv_len} equal to it."
        )
    if tuning is None:
        tuning = tuning_for(jax.default_backend(), jnp.dtype(query.dtype).name, causal, head_dim, q_len)
    cfgs = kernel_configs(
        tuning, q_len=q_len, kv_len=kv_len, head_dim=head_dim, has_segments=segment_ids is not None,
        causal=causal, scale=head_dim**-0.5 if scale is None else float(scale), group=heads // kv_heads,
        window=check_window(window, causal),
        interpret=jax.default_backend() == "cpu" if interpret is None else interpret,
    )
    padded_q, padded_kv = cfgs.forward.padded_q, cfgs.forward.padded_kv
    to_bhtd = lambda x, length: pad_length(jnp.swapaxes(x, 1, 2), length, 2)
    if segment_ids is not None:
        segment_ids = pad_length(segment_ids.astype(jnp.int32), padded_q, 1)
    out = attention_bhtd(
        cfgs, to_bhtd(query, padded_q), to_bhtd(key, padded_kv), to_bhtd(value, padded_kv), segment_ids
    )
    return jnp.swapaxes(out[:, :, :q_len], 1, 2)
