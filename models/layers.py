"""Transformer building blocks with logical-axis annotations.

Every parameter is created through `nn.with_logical_partitioning` and every einsum names its
dimensions, so that a mesh plus rules (see partitioning/) decide the layout. Kernels are
stored in `param_dtype` and cast to the compute `dtype` at use.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from models.attention import dot_product_attention

Initializer = Callable[..., jax.Array]

BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
BATCH_LENGTH_HEADS_KV = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
BATCH_LENGTH_MLP = ("activation_batch", "activation_length", "activation_mlp")
CACHE_BATCH_LENGTH = ("activation_batch", "activation_length")


def logical_param(module: nn.Module, name: str, init: Initializer, shape: Sequence[int],
                  axes: Sequence[str | None], dtype) -> jax.Array:
    """A parameter carrying logical axis names (one per dimension)."""
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype)


class Embed(nn.Module):
    """A lookup table [num_embeddings, features]; `attend` is the tied output projection."""

    num_embeddings: int
    features: int
    axes: tuple[str, str]
    init_std: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = logical_param(
            self, "embedding", nn.initializers.normal(self.init_std),
            (self.num_embeddings, self.features), self.axes, self.param_dtype,
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """x @ embedding.T with an fp32 result (the logits feed a softmax)."""
        return tied_logits(x, self.embedding.astype(self.dtype))


@jax.custom_vjp
def tied_logits(x: jax.Array, embedding: jax.Array) -> jax.Array:
    """[b, t, e] @ [v, e].T -> fp32 [b, t, v]. The backward casts the fp32 logit gradient to the
    operands' dtype first, so its two matmuls run in bf16 (fp32 accumulation) as the forward's
    does; left to autodiff they would promote to fp32 (TF32 on GPUs: ~13% of a GPT-2 124M step
    on an H100, docs/benchmarks.md)."""
    return jnp.einsum("bte,ve->btv", x, embedding, preferred_element_type=jnp.float32)


def _tied_logits_fwd(x, embedding):
    return tied_logits(x, embedding), (x, embedding)


def _tied_logits_bwd(residuals, g):
    x, embedding = residuals
    g = g.astype(x.dtype)
    d_x = jnp.einsum("btv,ve->bte", g, embedding, preferred_element_type=jnp.float32)
    d_embedding = jnp.einsum("btv,bte->ve", g, x, preferred_element_type=jnp.float32)
    return d_x.astype(x.dtype), d_embedding.astype(embedding.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


class LayerNorm(nn.Module):
    """LayerNorm over the last axis, computed in fp32, with 'embed'-named scale and bias."""

    epsilon: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = logical_param(self, "scale", nn.initializers.ones, (features,), ("embed",), self.param_dtype)
        bias = logical_param(self, "bias", nn.initializers.zeros, (features,), ("embed",), self.param_dtype)
        x = x.astype(jnp.float32)
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
        return (y * scale + bias).astype(self.dtype)


class MLP(nn.Module):
    """fc (embed -> mlp), GELU(tanh), proj (mlp -> embed); proj initialised with `out_init_std`."""

    mlp_dim: int
    init_std: float
    out_init_std: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        embed = x.shape[-1]
        p = self.param_dtype
        fc_kernel = logical_param(self, "fc_kernel", nn.initializers.normal(self.init_std),
                                  (embed, self.mlp_dim), ("embed", "mlp"), p)
        fc_bias = logical_param(self, "fc_bias", nn.initializers.zeros, (self.mlp_dim,), ("mlp",), p)
        proj_kernel = logical_param(self, "proj_kernel", nn.initializers.normal(self.out_init_std),
                                    (self.mlp_dim, embed), ("mlp", "embed"), p)
        proj_bias = logical_param(self, "proj_bias", nn.initializers.zeros, (embed,), ("embed",), p)
        h = jnp.einsum("bte,em->btm", x, fc_kernel.astype(self.dtype)) + fc_bias.astype(self.dtype)
        h = nn.with_logical_constraint(h, BATCH_LENGTH_MLP)
        h = checkpoint_name(jax.nn.gelu(h, approximate=True), "mlp_hidden")
        out = jnp.einsum("btm,me->bte", h, proj_kernel.astype(self.dtype)) + proj_bias.astype(self.dtype)
        return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)


class SelfAttention(nn.Module):
    """Multi-head self-attention with biases; q/k/v kernels [embed, heads, kv], out [heads, kv, embed]."""

    num_heads: int
    head_dim: int
    init_std: float
    out_init_std: float
    attention: str
    dropout_rate: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def projection(self, name: str, x: jax.Array) -> jax.Array:
        embed = x.shape[-1]
        kernel = logical_param(self, f"{name}_kernel", nn.initializers.normal(self.init_std),
                               (embed, self.num_heads, self.head_dim), ("embed", "heads", "kv"),
                               self.param_dtype)
        bias = logical_param(self, f"{name}_bias", nn.initializers.zeros,
                             (self.num_heads, self.head_dim), ("heads", "kv"), self.param_dtype)
        y = jnp.einsum("bte,ehd->bthd", x, kernel.astype(self.dtype)) + bias.astype(self.dtype)
        return checkpoint_name(nn.with_logical_constraint(y, BATCH_LENGTH_HEADS_KV), f"{name}_proj")

    def create_cache(self, key: jax.Array, value: jax.Array) -> None:
        """Zeroed decoding cache as long as this input: keys, values, which slots hold real tokens,
        and the next slot to write."""
        batch, length = key.shape[:2]
        for name, like in (("cached_key", key), ("cached_value", value)):
            self.variable("cache", name, nn.with_logical_partitioning(jnp.zeros, BATCH_LENGTH_HEADS_KV),
                          like.shape, like.dtype)
        self.variable("cache", "cached_valid", nn.with_logical_partitioning(jnp.zeros, CACHE_BATCH_LENGTH),
                      (batch, length), jnp.bool_)
        self.variable("cache", "cache_index", nn.with_logical_partitioning(jnp.zeros, ()), (), jnp.int32)

    def cached_attention(self, query: jax.Array, key: jax.Array, value: jax.Array,
                         segment_ids: jax.Array | None) -> jax.Array:
        """Write this chunk's keys/values at the cache index, then let each query attend to the
        cached slots up to its own that hold real tokens (segment id != 0)."""
        batch, length = query.shape[:2]
        index = self.get_variable("cache", "cache_index")
        valid = jnp.ones((batch, length), jnp.bool_) if segment_ids is None else segment_ids != 0
        updates = {"cached_key": key, "cached_value": value, "cached_valid": valid}
        for name, update in updates.items():
            cached = self.get_variable("cache", name)
            self.put_variable("cache", name, jax.lax.dynamic_update_slice_in_dim(cached, update, index, axis=1))
        self.put_variable("cache", "cache_index", index + length)
        slots = jnp.arange(self.get_variable("cache", "cached_key").shape[1])
        causal = slots[None, :] <= (index + jnp.arange(length))[:, None]
        mask = causal[None, None] & self.get_variable("cache", "cached_valid")[:, None, None, :]
        return jax.nn.dot_product_attention(query, self.get_variable("cache", "cached_key"),
                                            self.get_variable("cache", "cached_value"), mask=mask,
                                            implementation="xla")

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, deterministic: bool) -> jax.Array:
        """Causal self-attention. Decoding: applied with a mutable 'cache' collection, the first call
        creates a cache as long as its input and attends normally; later calls go through the cache."""
        embed = x.shape[-1]
        q, k, v = (self.projection(name, x) for name in ("query", "key", "value"))
        decoding = self.is_mutable_collection("cache") and not self.is_initializing()
        if decoding and self.has_variable("cache", "cached_key"):
            out = self.cached_attention(q, k, v, segment_ids)
        else:
            if decoding:
                self.create_cache(k, v)
            dropout = 0.0 if deterministic else self.dropout_rate
            rng = self.make_rng("dropout") if dropout > 0.0 else None
            out = dot_product_attention(q, k, v, causal=True, segment_ids=segment_ids,
                                        implementation=self.attention, dropout_rate=dropout, dropout_rng=rng)
        out = checkpoint_name(nn.with_logical_constraint(out, BATCH_LENGTH_HEADS_KV), "attention_out")
        out_kernel = logical_param(self, "out_kernel", nn.initializers.normal(self.out_init_std),
                                   (self.num_heads, self.head_dim, embed), ("heads", "kv", "embed"),
                                   self.param_dtype)
        out_bias = logical_param(self, "out_bias", nn.initializers.zeros, (embed,), ("embed",), self.param_dtype)
        y = jnp.einsum("bthd,hde->bte", out, out_kernel.astype(self.dtype)) + out_bias.astype(self.dtype)
        return nn.with_logical_constraint(y, BATCH_LENGTH_EMBED)


REMAT_POLICIES: dict[str, Callable | None] = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj"),
    "minimal_offloaded": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}
"""Named rematerialisation policies ('none' = keep every activation, no remat). 'minimal_offloaded'
saves what 'minimal' saves in host memory instead of device memory (GPU/TPU)."""


def remat(block: type[nn.Module], policy: str) -> type[nn.Module]:
    """Wrap a block class in nn.remat with a named policy; 'none' returns it unchanged."""
    if policy == "none":
        return block
    if policy not in REMAT_POLICIES:
        raise ValueError(
            f"remat policy {policy!r} is unknown; choose 'none' or one of {sorted(REMAT_POLICIES)}."
        )
    return nn.remat(block, policy=REMAT_POLICIES[policy], prevent_cse=True)


def scaled_residual_std(init_std: float, num_layers: int) -> float:
    """GPT-2's residual-projection init: std / sqrt(2 * n_layer)."""
    return init_std / math.sqrt(2 * num_layers)
