"""The Pallas kernels of flash attention (models/kernels/flash_attention.py calls them): the forward pass with
its online softmax, and the backward pass's two kernels (dQ over query blocks, dK/dV over key blocks), with the
block-level masking they share (causal, a sliding window, packed segments, padded keys). Layout [batch, heads,
length, head_dim]."""
from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
NT_DIMS = (((1,), (1,)), ((), ()))  # contract the last dim of both operands: a @ b.T
TN_DIMS = (((0,), (0,)), ((), ()))  # contract the first dim of both operands: a.T @ b


@dataclasses.dataclass(frozen=True)
class Config:
    """Static description of one kernel of one attention call: the call's shape and masks (the same for the
    three kernels) and this kernel's blocks and launch (flash_attention_tuning.KernelTuning)."""

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
    window: int | None = None  # causal sliding window: query i sees key j iff 0 <= i + offset - j < window
    num_warps: int = 4  # Triton (GPU) only
    num_stages: int = 2  # Triton (GPU) only: software-pipelining depth of the kernel's walk over blocks

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
    if cfg.window is not None:
        mask = conj(mask, q_pos + cfg.causal_offset - k_pos < cfg.window)
    if cfg.masks_kv_padding:
        mask = conj(mask, k_pos < cfg.kv_len)
    if cfg.has_segments:
        mask = conj(mask, (q_seg == k_seg) & (k_seg != 0))
    return mask


def key_blocks_start(cfg: Config, q_block):
    """The first key block a query block can see: 0, or with a window the block of the first row's first key."""
    if cfg.window is None:
        return 0
    first_key = q_block * cfg.block_q + cfg.causal_offset - (cfg.window - 1)
    return jnp.clip(first_key // cfg.block_k, 0, cfg.padded_kv // cfg.block_k)


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


def query_blocks_end(cfg: Config, k_block):
    """One past the last query block that can see a key block: all, or with a window the block of the
    last query whose window still holds the key block's last key."""
    num_q = cfg.padded_q // cfg.block_q
    if cfg.window is None:
        return num_q
    last_query = (k_block + 1) * cfg.block_k - 1 + cfg.window - 1 - cfg.causal_offset
    return jnp.clip(last_query // cfg.block_q + 1, 0, num_q)


def unmasked_key_blocks_start(cfg: Config, q_block):
    """Key blocks before this one may fall outside the window of the query block's last row."""
    if cfg.window is None:
        return 0
    last_row_first_key = (q_block + 1) * cfg.block_q - 1 + cfg.causal_offset - (cfg.window - 1)
    return jnp.clip(-(-last_row_first_key // cfg.block_k), 0, cfg.padded_kv // cfg.block_k)


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


def unmasked_query_blocks_end(cfg: Config, k_block):
    """Query blocks from this one on may have the key block's first key outside their window."""
    num_q = cfg.padded_q // cfg.block_q
    if cfg.window is None:
        return num_q
    last_query_sees_first_key = k_block * cfg.block_k + cfg.window - 1 - cfg.causal_offset
    return jnp.clip((last_query_sees_first_key + 1) // cfg.block_q, 0, num_q)


def split_refs(cfg: Config, refs):
    """Kernel refs after the fixed inputs: (query segments, key segments) when present, then outputs."""
    if cfg.has_segments:
        return refs[0], refs[1], refs[2:]
    return None, None, refs


def iota(shape, dim, start):
    return start + lax.broadcasted_iota(jnp.int32, shape, dim)


# ----------------------------------------------------------------------------- kernels


def three_phase_loop(lo, unmasked_lo, unmasked_hi, hi, body, carry):
    """body(i, carry, masked) over [lo, hi): unmasked on [unmasked_lo, unmasked_hi) (clipped into it; empty
    when unmasked_hi <= unmasked_lo), masked on the blocks before and after. A masked phase whose bounds are
    the same Python int (no window) is left out of the kernel."""
    masked, unmasked = functools.partial(body, masked=True), functools.partial(body, masked=False)
    static = lambda a, b: isinstance(a, int) and isinstance(b, int) and a == b
    if not static(lo, unmasked_lo):
        unmasked_lo = jnp.clip(unmasked_lo, lo, hi)
        carry = lax.fori_loop(lo, unmasked_lo, masked, carry)
    if static(unmasked_hi, hi):
        return lax.fori_loop(unmasked_lo, hi, unmasked, carry)
    unmasked_hi = jnp.clip(unmasked_hi, unmasked_lo, hi)
    carry = lax.fori_loop(unmasked_lo, unmasked_hi, unmasked, carry)
    return lax.fori_loop(unmasked_hi, hi, masked, carry)


def key_block_phases(cfg: Config, q_block):
    """(first, first unmasked, end of unmasked, end) key blocks of a query block, for three_phase_loop."""
    return (key_blocks_start(cfg, q_block), unmasked_key_blocks_start(cfg, q_block),
            unmasked_key_blocks_end(cfg, q_block), key_blocks_end(cfg, q_block))


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
    acc, row_max, row_sum = three_phase_loop(*key_block_phases(cfg, q_block), body, init)
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
    dq = three_phase_loop(*key_block_phases(cfg, q_block), body, dq)
    dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: Config, atomic_add=None):
    """dK and dV for one key block of one KV head, summed over its query heads and query blocks.

    Works on transposed scores (keys x queries) so every product is a plain or an a @ b.T matmul. With
    `atomic_add` (the fused backward: Triton's, or interpret mode's) it also adds each query block's share of
    dQ, dS.T @ K, into the float32 dQ output, so the backward needs no second pass over the scores; the refs
    then end with dQ's zero-filled input (aliased to it), dK, dV and dQ.
    """
    q_seg_ref, kv_seg_ref, outputs = split_refs(cfg, refs)
    dk_ref, dv_ref = outputs[-3:-1] if atomic_add else outputs
    bq, bk = cfg.block_q, cfg.block_k
    k_block = pl.program_id(2)
    k, v = k_ref[...], v_ref[...]
    k_pos = iota((bk, bq), 0, k_block * bk)
    k_seg = kv_seg_ref[...] if cfg.has_segments else None
    phases = (query_blocks_start(cfg, k_block), unmasked_query_blocks_start(cfg, k_block),
              unmasked_query_blocks_end(cfg, k_block), query_blocks_end(cfg, k_block))

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
            ds_t = (p_t * (dp_t - delta)).astype(q.dtype)
            dk = dk + jnp.dot(ds_t, q, preferred_element_type=jnp.float32)
            if atomic_add is not None:
                dq = lax.dot_general(ds_t, k, TN_DIMS, preferred_element_type=jnp.float32) * cfg.scale
                atomic_add(outputs[-1], (g, pl.ds(start, bq), slice(None)), dq)
            return dk, dv

        return three_phase_loop(*phases, body, carry)

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = lax.fori_loop(0, cfg.group, over_query_blocks, (zeros, zeros))
    dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- pallas_call wiring
