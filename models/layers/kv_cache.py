"""The decoding cache: arrays [batch, cache_len, ...] in a module's 'cache' collection, filled chunk by chunk
at `cache_index`. Decoding applies a model with mutable=['cache']: the first such call creates the cache as
long as its input (e.g. zeros [batch, prompt + new tokens]) and computes as without one; each later call
writes its tokens' entries at the index and reads the whole cache.

Attention keeps its keys and values (`self_attention`), and cross-attention its context's keys and values
(`keep_context` / `context`); T5's decoder keeps its token positions the same way. The cache's variables
carry logical axis names, so a mesh shards them as it shards the activations."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers.dense import BATCH_LENGTH_HEADS_KV, CACHE_BATCH_LENGTH

COLLECTION = "cache"
INDEX = "cache_index"
AXES = {0: (), 2: CACHE_BATCH_LENGTH, 4: BATCH_LENGTH_HEADS_KV}
"""Logical axes of a cached array by its rank: the index, [batch, length] or [batch, length, heads, head_dim]."""


def is_decoding(module: nn.Module) -> bool:
    """Whether the module is applied for KV-cache decoding (a mutable 'cache', not initialising)."""
    return module.is_mutable_collection(COLLECTION) and not module.is_initializing()


def has(module: nn.Module, name: str) -> bool:
    return module.has_variable(COLLECTION, name)


def variable(module: nn.Module, name: str, shape: tuple[int, ...], dtype) -> nn.Variable:
    """A cache variable, zeros at creation, named by the axes of its rank."""
    return module.variable(COLLECTION, name, nn.with_logical_partitioning(jnp.zeros, AXES[len(shape)]), shape, dtype)


def keep(module: nn.Module, arrays: dict[str, jax.Array]) -> None:
    """Cache variables holding these arrays."""
    for name, array in arrays.items():
        variable(module, name, array.shape, array.dtype).value = array


def read(module: nn.Module, *names: str) -> tuple[jax.Array, ...]:
    return tuple(module.get_variable(COLLECTION, name) for name in names)


def create(module: nn.Module, like: dict[str, jax.Array]) -> None:
    """A zeroed cache with one entry per slot of these [batch, cache_len, ...] arrays, and its index 0."""
    for name, array in like.items():
        variable(module, name, array.shape, array.dtype)
    variable(module, INDEX, (), jnp.int32)


def append(module: nn.Module, updates: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Write each update [batch, length, ...] at the cache index and advance the index by length;
    returns (the index written at, the whole cached arrays)."""
    index = module.get_variable(COLLECTION, INDEX)
    cached = {}
    for name, update in updates.items():
        cached[name] = jax.lax.dynamic_update_slice_in_dim(module.get_variable(COLLECTION, name), update, index, axis=1)
        module.put_variable(COLLECTION, name, cached[name])
    module.put_variable(COLLECTION, INDEX, index + next(iter(updates.values())).shape[1])
    return index, cached


def self_attention(module: nn.Module, key: jax.Array, value: jax.Array, segment_ids: jax.Array | None,
                   window: int | None = None) -> tuple[jax.Array, jax.Array, jax.Array] | None:
    """Self-attention through the cache while decoding: None when not decoding or on the call that
    creates the cache (attend as without one); else this chunk's keys/values written at the index and
    (cached keys, cached values, mask [batch, 1, q_len, cache_len]): each query sees the filled slots up
    to its own that hold real tokens (segment id != 0) and, with a sliding `window`, only the slots less
    than `window` before its own (slots are contiguous, padding included, as the forward pass counts)."""
    if not is_decoding(module):
        return None
    batch, length = key.shape[:2]
    valid = jnp.ones((batch, length), jnp.bool_) if segment_ids is None else segment_ids != 0
    entries = {"cached_key": key, "cached_value": value, "cached_valid": valid}
    if not has(module, "cached_key"):
        create(module, entries)
        return None
    index, cached = append(module, entries)
    slots = jnp.arange(cached["cached_key"].shape[1])
    distance = (index + jnp.arange(length))[:, None] - slots[None, :]
    causal = distance >= 0
    if window is not None:
        causal &= distance < window
    mask = causal[None, None] & cached["cached_valid"][:, None, None, :]
    return cached["cached_key"], cached["cached_value"], mask
