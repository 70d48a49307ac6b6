"""jax's TPU splash-attention kernels behind our BTNH attention signature.

No kernel of ours: this adapts `jax.experimental.pallas.ops.tpu.splash_attention` (the block-sparse
FlashAttention MaxText runs on TPU: forward, dQ and dK/dV kernels under a custom VJP, with the
logsumexp as the only O(T) residual) to `models.attention`'s conventions:

- BTNH in and out (the kernels take [heads, length, head_dim] per example and run vmapped over batch);
- `scale` multiplies the query before the kernel (the kernels have no scale of their own);
- a causal mask is a block-sparse `CausalMask`: key blocks above the diagonal are skipped, not masked;
  a causal sliding window of W keys is a `LocalMask` with window (W - 1, 0), which also skips the key
  blocks wholly left of the window;
- grouped-query / multi-query attention: K/V with fewer heads go in as they are (the MHA kernels map
  query head h to K/V head h // group);
- segment ids: the kernels allow (query, key) pairs of equal id; ours also make segment id 0 padding
  that attends nowhere, so padding rows (which the kernels let attend to other padding) are zeroed
  afterwards, which zeroes their gradients too. Real rows never see padding keys (their ids differ).

Off TPU the kernels run interpreted: `interpret=True` runs Pallas' HLO interpreter (the same vmapped
kernels, block tables and masks, exact), which also runs per shard under a multi-device CPU mesh.
`make_kernel` also takes `pltpu.InterpretParams()`, jax's TPU interpret mode (it simulates TPU
memory, DMAs and semaphores); with jax 0.10.2 that mode serves one example per call (it rejects the
grid dimension vmap adds) and stalls inside shard_map over several CPU devices, so it is used by the
tests, per example, rather than by the model path.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as splash_mask

from models.kernels.window import check_window

BlockSizes = splash.BlockSizes

LANES = 128
"""Every block must be a multiple of this (the TPU's vector lanes), so lengths must be too."""

BLOCK_CHOICES = (512, 256, 128)
"""Block sizes tried, largest first: MaxText's default splash block is 512."""


def unsupported_reason(q_len: int, kv_len: int, *, has_kv_segment_ids: bool) -> str | None:
    """Why the splash kernels cannot serve attention of these lengths, or None when they can."""
    if q_len != kv_len:
        return f"query length {q_len} differs from key length {kv_len} (cross-attention or decoding)"
    if has_kv_segment_ids:
        return "the keys carry their own kv_segment_ids (cross-attention)"
    if q_len % LANES:
        return f"length {q_len} is not a multiple of {LANES}"
    return None


def block_sizes_for(q_len: int, kv_len: int) -> BlockSizes:
    """The largest of BLOCK_CHOICES that divides each length, for the forward and both backward
    kernels. Raises ValueError when a length is not a multiple of LANES."""
    def largest(length: int) -> int:
        for block in BLOCK_CHOICES:
            if length % block == 0:
                return block
        raise ValueError(f"splash attention needs lengths that are multiples of {LANES}; got {length}. "
                         "Pad the sequence length, or use implementation 'xla'.")

    bq, bkv = largest(q_len), largest(kv_len)
    return BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv,
                      block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                      block_q_dq=bq, block_kv_dq=bkv)


def make_kernel(num_heads: int, length: int, *, causal: bool, block_sizes: BlockSizes,
                interpret: bool | pltpu.InterpretParams = False, window: int | None = None):
    """A splash MHA kernel for one example's [num_heads, length, head_dim] queries (K/V may have
    fewer heads). interpret: False (compile for TPU), True (HLO interpreter) or TPU interpret mode.
    window: a causal sliding window (query i sees keys i - window < j <= i); needs causal."""
    shape = (length, length)
    window = check_window(window, causal)
    if window is not None:
        mask = splash_mask.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    else:
        mask = splash_mask.CausalMask(shape) if causal else splash_mask.FullMask(shape)
    return splash.make_splash_mha(
        splash_mask.MultiHeadMask([mask] * num_heads), block_sizes=block_sizes, head_shards=1, q_seq_shards=1,
        interpret=interpret)


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, segment_ids: jax.Array | None, *,
                     causal: bool, scale: float | None = None, block_sizes: BlockSizes | None = None,
                     interpret: bool = False, window: int | None = None) -> jax.Array:
    """Attention over BTNH inputs (equal query and key lengths, a multiple of LANES) with the splash
    kernels, vmapped over the batch; returns BTNH. block_sizes default to `block_sizes_for` the
    lengths. interpret: run the kernels interpreted (any backend; slow, exact). window: a causal
    sliding window of that many keys (see make_kernel)."""
    batch, length, num_heads, head_dim = query.shape
    if block_sizes is None:
        block_sizes = block_sizes_for(length, key.shape[1])
    kernel = make_kernel(num_heads, length, causal=causal, block_sizes=block_sizes, interpret=interpret,
                         window=window)
    scale = head_dim**-0.5 if scale is None else scale
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in ((query * scale).astype(query.dtype), key, value))

    def one_example(args):
        q1, k1, v1, *segments = args
        return kernel(q1, k1, v1, segment_ids=splash.SegmentIds(segments[0], segments[0]) if segments else None)

    args = (q, k, v) if segment_ids is None else (q, k, v, segment_ids)
    out = jax.vmap(one_example)(args)
    out = jnp.swapaxes(out, 1, 2)
    if segment_ids is not None:  # padding rows attend nowhere (their gradients vanish with them)
        out = jnp.where((segment_ids != 0)[:, :, None, None], out, jnp.zeros((), out.dtype))
    return out
