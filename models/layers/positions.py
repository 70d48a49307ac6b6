"""Positions inside attention: rotary embeddings (GPT-NeoX, Llama; Llama 3.1's scaled frequencies) and T5's relative position bias. Learned
absolute positions (GPT-2, BERT) are an `Embed` table."""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers.dense import normal_param


@dataclasses.dataclass(frozen=True)
class Rotary:
    """Rotary position embeddings (RoPE) in GPT-NeoX's rotate-half layout on the first `dim` dims of each
    head: dims i and i + dim/2 form a pair rotated by position * frequency i; the remaining dims pass
    through. A frequency scaling (Llama 3's) is another `inverse_frequencies`."""

    dim: int
    base: float = 10000.0

    def inverse_frequencies(self) -> jax.Array:
        """base^(-2i/dim), one per pair: the angle each pair turns by per position."""
        return 1.0 / self.base ** (jnp.arange(0, self.dim, 2, dtype=jnp.float32) / self.dim)

    def __call__(self, x: jax.Array, positions: jax.Array) -> jax.Array:
        """x [batch, length, heads, head_dim] rotated at positions [batch or 1, length]."""
        angles = positions[..., None].astype(jnp.float32) * self.inverse_frequencies()  # [batch, length, dim/2]
        angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
        cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
        half = self.dim // 2
        rot, rest = x[..., :self.dim], x[..., self.dim:]
        rotated_half = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
        return jnp.concatenate([rot * cos + rotated_half * sin, rest], axis=-1)


def relative_position_bucket(relative_position: jax.Array, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
    """T5's bucket of (key position - query position): distances below half the buckets get their own
    bucket, longer ones share log-spaced buckets up to max_distance (and the last bucket beyond).
    Bidirectional splits the buckets between keys before and after the query; otherwise keys after
    the query all fall into bucket 0."""
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).astype(relative_position.dtype) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = jnp.maximum(-relative_position, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    large = jnp.minimum(max_exact + (log_ratio * (num_buckets - max_exact)).astype(distance.dtype), num_buckets - 1)
    return buckets + jnp.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
    """T5's learned attention bias per (bucket of relative position, head): a table
    [num_buckets, heads], computed once per stack and added to every layer's logits."""

    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    init_std: float
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
        """Positions [batch or 1, q_len] and [batch or 1, kv_len] -> fp32 bias [batch or 1, heads, q_len, kv_len]."""
        table = normal_param(self, "embedding", self.init_std, (self.num_buckets, self.num_heads),
                             ("relpos_buckets", "heads"), self.param_dtype)
        buckets = relative_position_bucket(
            key_positions[:, None, :] - query_positions[:, :, None], bidirectional=self.bidirectional,
            num_buckets=self.num_buckets, max_distance=self.max_distance)
        bias = jnp.take(table.astype(jnp.float32), buckets, axis=0)
        return jnp.transpose(bias, (0, 3, 1, 2))
