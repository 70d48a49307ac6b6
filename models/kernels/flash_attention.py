"""Flash attention in Pallas: forward and backward, causal, packed segments, grouped KV heads.

One kernel source in the portable `pl.pallas_call` grid style. It lowers through Triton on GPU
(while the installed jax ships `jax.experimental.pallas.triton`), through Mosaic on TPU, and runs
with `interpret=True` on CPU (chosen automatically there), so CPU tests exercise the real kernels.

Layout inside the kernels is [batch, heads, length, head_dim]; `flash_attention` takes and returns
BTNH like `jax.nn.dot_product_attention` and transposes at the boundary. Lengths that are not a
multiple of the block size are padded and the padded keys masked inside the kernel.

The algorithm is FlashAttention-2: the forward pass walks the key blocks of one query block with an
online softmax and saves the log-sum-exp per query row; the backward pass recomputes the
probabilities block by block from it, in two kernels (dK/dV over key blocks, dQ over query blocks),
so no [length, length] matrix ever reaches HBM. A query row with no allowed key (segment id 0, or a
causal row before the first key) gets output 0 and gradient 0.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

try:  # Deprecated since jax 0.11 in favour of Mosaic GPU; without it GPU 'pallas' raises.
    from jax.experimental.pallas import triton as pl_triton
except ImportError:  # pragma: no cover - depends on the installed jax
    pl_triton = None

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
NT_DIMS = (((1,), (1,)), ((), ()))  # contract the last dim of both operands: a @ b.T


@dataclasses.dataclass(frozen=True)
class Config:
    """Static description of one attention call, shared by the three kernels."""

    causal: bool
    scale: float
    q_len: int
    kv_len: int
    block_q: int
    block_k: int
    padded_q: int
    padded_kv: int
    group: int  # query heads per key/value head
    has_segments: bool
    interpret: bool

    @property
    def causal_offset(self) -> int:
        """Query i may see key j <= i + offset (bottom-right aligned, as jnp.tril(k=kv-q))."""
        return self.kv_len - self.q_len

    @property
    def masks_kv_padding(self) -> bool:
        return self.padded_kv != self.kv_len


# ----------------------------------------------------------------------------- masks and bounds


def allowed(cfg: Config, q_pos, k_pos, q_seg, k_seg):
    """Boolean mask of allowed (query, key) pairs for broadcastable positions/segments, or None."""
    mask = None

    def conj(a, b):
        return b if a is None else a & b

    if cfg.causal:
        mask = conj(mask, k_pos <= q_pos + cfg.causal_offset)
    if cfg.masks_kv_padding:
        mask = conj(mask, k_pos < cfg.kv_len)
    if cfg.has_segments:
        mask = conj(mask, (q_seg == k_seg) & (k_seg != 0))
    return mask


def key_blocks_end(cfg: Config, q_block):
    """One past the last key block a query block can see."""
    num_k = cfg.padded_kv // cfg.block_k
    if not cfg.causal:
        return num_k
    last_key = (q_block + 1) * cfg.block_q - 1 + cfg.causal_offset
    return jnp.clip(last_key // cfg.block_k + 1, 0, num_k)


def query_blocks_start(cfg: Config, k_block):
    """The first query block that can see a key block."""
    if not cfg.causal:
        return 0
    first_query = k_block * cfg.block_k - cfg.causal_offset
    return jnp.clip(first_query // cfg.block_q, 0, cfg.padded_q // cfg.block_q)


def unmasked_key_blocks_end(cfg: Config, q_block):
    """Key blocks [0, this) are visible to every row of the query block, so need no mask."""
    if cfg.has_segments:
        return 0
    end = cfg.kv_len // cfg.block_k  # blocks without key padding
    if cfg.causal:
        first_row_sees = q_block * cfg.block_q + cfg.causal_offset  # the first row's last key
        end = jnp.clip((first_row_sees + 1) // cfg.block_k, 0, end)
    return end


def unmasked_query_blocks_start(cfg: Config, k_block):
    """Query blocks [this, end) see every key of the key block, so need no mask."""
    num_q = cfg.padded_q // cfg.block_q
    if cfg.has_segments:
        return num_q
    last_key = (k_block + 1) * cfg.block_k - 1
    start = 0
    if cfg.causal:
        start = jnp.clip(-(-(last_key - cfg.causal_offset) // cfg.block_q), 0, num_q)
    return jnp.where(last_key < cfg.kv_len, start, num_q)


def split_refs(cfg: Config, refs):
    """Kernel refs after the fixed inputs: (query segments, key segments) when present, then outputs."""
    if cfg.has_segments:
        return refs[0], refs[1], refs[2:]
    return None, None, refs


def iota(shape, dim, start):
    return start + lax.broadcasted_iota(jnp.int32, shape, dim)


# ----------------------------------------------------------------------------- kernels


def two_phase_loop(lo, mid, hi, body, carry, *, masked_first: bool):
    """body(i, carry, masked) over [lo, hi): masked on [lo, mid) or [mid, hi) as masked_first says."""
    mid = jnp.clip(mid, lo, hi)
    carry = lax.fori_loop(lo, mid, functools.partial(body, masked=masked_first), carry)
    return lax.fori_loop(mid, hi, functools.partial(body, masked=not masked_first), carry)


def forward_kernel(q_ref, k_ref, v_ref, *refs, cfg: Config):
    """One query block: online softmax over the visible key blocks; writes output and lse."""
    q_seg_ref, kv_seg_ref, (o_ref, lse_ref) = split_refs(cfg, refs)
    bq, bk = cfg.block_q, cfg.block_k
    q_block = pl.program_id(2)
    q = q_ref[...]
    q_pos = iota((bq, bk), 0, q_block * bq)
    q_seg = q_seg_ref[...] if cfg.has_segments else None

    def body(j, carry, masked):
        acc, row_max, row_sum = carry
        start = pl.multiple_of(j * bk, bk)
        k = k_ref[pl.ds(start, bk), :]
        v = v_ref[pl.ds(start, bk), :]
        s = lax.dot_general(q, k, NT_DIMS, preferred_element_type=jnp.float32) * cfg.scale
        mask = None
        if masked:
            k_seg = kv_seg_ref[:, pl.ds(start, bk)] if cfg.has_segments else None
            mask = allowed(cfg, q_pos, iota((bq, bk), 1, start), q_seg, k_seg)
        if mask is not None:
            s = jnp.where(mask, s, MASK_VALUE)
        new_max = jnp.maximum(row_max, jnp.max(s, axis=1, keepdims=True))
        p = jnp.exp(s - new_max)
        if mask is not None:
            p = jnp.where(mask, p, 0.0)
        rescale = jnp.exp(row_max - new_max)
        row_sum = rescale * row_sum + jnp.sum(p, axis=1, keepdims=True)
        acc = rescale * acc + jnp.dot(
            p.astype(v.dtype), v, preferred_element_type=jnp.float32
        )
        return acc, new_max, row_sum

    head_dim = q.shape[-1]
    init = (
        jnp.zeros((bq, head_dim), jnp.float32),
        jnp.full((bq, 1), MASK_VALUE, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
    )
    mid, end = unmasked_key_blocks_end(cfg, q_block), key_blocks_end(cfg, q_block)
    acc, row_max, row_sum = two_phase_loop(0, mid, end, body, init, masked_first=False)
    empty = row_sum == 0.0  # no allowed key: output 0, and an lse that masks to p = 0
    o_ref[...] = (acc / jnp.where(empty, 1.0, row_sum)).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, 0.0, row_max + jnp.log(jnp.where(empty, 1.0, row_sum)))


def dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: Config):
    """dQ for one query block, walking the visible key blocks."""
    q_seg_ref, kv_seg_ref, (dq_ref,) = split_refs(cfg, refs)
    bq, bk = cfg.block_q, cfg.block_k
    q_block = pl.program_id(2)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    q_pos = iota((bq, bk), 0, q_block * bq)
    q_seg = q_seg_ref[...] if cfg.has_segments else None

    def body(j, dq, masked):
        start = pl.multiple_of(j * bk, bk)
        k = k_ref[pl.ds(start, bk), :]
        v = v_ref[pl.ds(start, bk), :]
        s = lax.dot_general(q, k, NT_DIMS, preferred_element_type=jnp.float32) * cfg.scale
        p = jnp.exp(s - lse)
        if masked:
            k_seg = kv_seg_ref[:, pl.ds(start, bk)] if cfg.has_segments else None
            mask = allowed(cfg, q_pos, iota((bq, bk), 1, start), q_seg, k_seg)
            p = p if mask is None else jnp.where(mask, p, 0.0)
        dp = lax.dot_general(do, v, NT_DIMS, preferred_element_type=jnp.float32)
        ds = p * (dp - delta)
        return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

    dq = jnp.zeros(q.shape, jnp.float32)
    mid, end = unmasked_key_blocks_end(cfg, q_block), key_blocks_end(cfg, q_block)
    dq = two_phase_loop(0, mid, end, body, dq, masked_first=False)
    dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: Config):
    """dK and dV for one key block of one KV head, summed over its query heads and query blocks.

    Works on transposed scores (keys x queries) so every product is a plain or an a @ b.T matmul.
    """
    q_seg_ref, kv_seg_ref, (dk_ref, dv_ref) = split_refs(cfg, refs)
    bq, bk = cfg.block_q, cfg.block_k
    k_block = pl.program_id(2)
    k, v = k_ref[...], v_ref[...]
    k_pos = iota((bk, bq), 0, k_block * bk)
    k_seg = kv_seg_ref[...] if cfg.has_segments else None
    first, mid = query_blocks_start(cfg, k_block), unmasked_query_blocks_start(cfg, k_block)
    num_q = cfg.padded_q // bq

    def over_query_blocks(g, carry):
        def body(i, carry, masked):
            dk, dv = carry
            start = pl.multiple_of(i * bq, bq)
            q = q_ref[g, pl.ds(start, bq), :]
            do = do_ref[g, pl.ds(start, bq), :]
            lse = lse_ref[g, :, pl.ds(start, bq)]
            delta = delta_ref[g, :, pl.ds(start, bq)]
            s_t = lax.dot_general(k, q, NT_DIMS, preferred_element_type=jnp.float32) * cfg.scale
            p_t = jnp.exp(s_t - lse)
            if masked:
                q_seg = q_seg_ref[:, pl.ds(start, bq)] if cfg.has_segments else None
                mask = allowed(cfg, iota((bk, bq), 1, start), k_pos, q_seg, k_seg)
                p_t = p_t if mask is None else jnp.where(mask, p_t, 0.0)
            dv = dv + jnp.dot(p_t.astype(do.dtype), do, preferred_element_type=jnp.float32)
            dp_t = lax.dot_general(v, do, NT_DIMS, preferred_element_type=jnp.float32)
            ds_t = p_t * (dp_t - delta)
            dk = dk + jnp.dot(ds_t.astype(q.dtype), q, preferred_element_type=jnp.float32)
            return dk, dv

        return two_phase_loop(first, mid, num_q, body, carry, masked_first=True)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, cfg.group, over_query_blocks, (zeros, zeros))
    dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- pallas_call wiring


def compiler_params(head_dim: int):
    """Backend-specific tuning for the current default backend (None on CPU/interpret)."""
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
        return pl_triton.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)
    return None


def call(kernel, cfg: Config, grid, in_specs, out_specs, out_shape, head_dim, *args):
    return pl.pallas_call(
        functools.partial(kernel, cfg=cfg),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=cfg.interpret,
        compiler_params=None if cfg.interpret else compiler_params(head_dim),
        name=kernel.__name__,
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
    return call(forward_kernel, cfg, grid, in_specs, out_specs, out_shape, head_dim, *args)


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
    return call(dq_kernel, cfg, grid, in_specs, q_block, out_shape, head_dim, *args)


def backward_dkv(cfg: Config, q, k, v, do, lse, delta, segment_ids):
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
    out_shape = [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)]
    return call(dkv_kernel, cfg, grid, in_specs, [kv_block, kv_block], out_shape, head_dim, *args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def attention_bhtd(cfg: Config, q, k, v, segment_ids):
    return forward(cfg, q, k, v, segment_ids)[0]


def attention_bhtd_fwd(cfg: Config, q, k, v, segment_ids):
    out, lse = forward(cfg, q, k, v, segment_ids)
    return out, (q, k, v, segment_ids, out, lse)


def attention_bhtd_bwd(cfg: Config, residuals, do):
    q, k, v, segment_ids, out, lse = residuals
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    dq = backward_dq(cfg, q, k, v, do, lse, delta, segment_ids)
    as_rows = lambda x: jnp.swapaxes(x, 2, 3)  # [B,H,T,1] -> [B,H,1,T], same bytes
    dk, dv = backward_dkv(cfg, q, k, v, do, as_rows(lse), as_rows(delta), segment_ids)
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


def flash_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    segment_ids: jax.Array | None = None,
    *,
    causal: bool = True,
    scale: float | None = None,
    block_q: int = 128,
    block_k: int = 128,
    interpret: bool | None = None,
) -> jax.Array:
    """Fused attention over BTNH inputs; key/value may have fewer heads (GQA / MQA).

    segment_ids: int [batch, length] (needs equal query and key lengths); 0 marks padding, which
    attends nowhere (output 0) and is attended by nobody. scale defaults to head_dim ** -0.5.
    interpret: None runs interpreted on CPU and compiled elsewhere.
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
    block_q, block_k = pick_block(q_len, block_q), pick_block(kv_len, block_k)
    padded_q, padded_kv = round_up(q_len, block_q), round_up(kv_len, block_k)
    if segment_ids is not None:  # one padded length serves both the query and key layouts
        padded_q = padded_kv = round_up(q_len, math.lcm(block_q, block_k))
    cfg = Config(
        causal=causal,
        scale=head_dim**-0.5 if scale is None else float(scale),
        q_len=q_len,
        kv_len=kv_len,
        block_q=block_q,
        block_k=block_k,
        padded_q=padded_q,
        padded_kv=padded_kv,
        group=heads // kv_heads,
        has_segments=segment_ids is not None,
        interpret=jax.default_backend() == "cpu" if interpret is None else interpret,
    )
    to_bhtd = lambda x, length: pad_length(jnp.swapaxes(x, 1, 2), length, 2)
    if segment_ids is not None:
        segment_ids = pad_length(segment_ids.astype(jnp.int32), padded_q, 1)
    out = attention_bhtd(
        cfg, to_bhtd(query, padded_q), to_bhtd(key, padded_kv), to_bhtd(value, padded_kv), segment_ids
    )
    return jnp.swapaxes(out[:, :, :q_len], 1, 2)
