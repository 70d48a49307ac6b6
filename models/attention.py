"""Attention entry point: one signature, several implementations.

`dot_product_attention` takes BTNH tensors (batch, length, heads, head_dim), as
`jax.nn.dot_product_attention` does. Key/value may carry fewer heads than the query
(grouped-query / multi-query attention); query heads are split evenly over them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("auto", "xla", "cudnn")


def attention_mask(
    q_len: int, kv_len: int, *, causal: bool, segment_ids: jax.Array | None
) -> jax.Array | None:
    """Boolean [batch or 1, 1, q_len, kv_len] mask of allowed (query, key) pairs, or None.

    Segment id 0 marks padding: a padding query attends nowhere and no query attends to it.
    """
    mask = None
    if causal:
        mask = jnp.tril(jnp.ones((q_len, kv_len), dtype=bool), k=kv_len - q_len)[None, None]
    if segment_ids is not None:
        same = segment_ids[:, :, None] == segment_ids[:, None, :]
        same &= (segment_ids != 0)[:, None, :]
        same = same[:, None]
        mask = same if mask is None else mask & same
    return mask


def xla_attention(query, key, value, *, causal, segment_ids, dropout_rate=0.0, dropout_rng=None):
    """Reference attention in plain jnp: fp32 softmax, masks, optional dropout on the probabilities."""
    batch, q_len, num_heads, head_dim = query.shape
    kv_heads = key.shape[2]
    if num_heads % kv_heads:
        raise ValueError(
            f"query has {num_heads} heads, key/value {kv_heads}: the query heads must be a multiple "
            "of the key/value heads (grouped-query attention)."
        )
    group = num_heads // kv_heads
    query = query.reshape(batch, q_len, kv_heads, group, head_dim)
    logits = jnp.einsum("bqkgh,bskh->bkgqs", query, key, preferred_element_type=jnp.float32)
    logits *= head_dim**-0.5
    mask = attention_mask(q_len, key.shape[1], causal=causal, segment_ids=segment_ids)
    if mask is not None:
        logits = jnp.where(mask[:, :, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    if mask is not None:  # rows with no allowed key (padding) give zeros, not a uniform average
        probs = jnp.where(mask[:, :, None], probs, 0.0)
    if dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    out = jnp.einsum("bkgqs,bskh->bqkgh", probs.astype(value.dtype), value)
    return out.reshape(batch, q_len, num_heads, head_dim)


def cudnn_attention(query, key, value, *, causal, segment_ids):
    """cuDNN fused attention through jax.nn.dot_product_attention (GPU only)."""
    mask = None
    if segment_ids is not None:
        mask = attention_mask(query.shape[1], key.shape[1], causal=False, segment_ids=segment_ids)
    return jax.nn.dot_product_attention(
        query, key, value, mask=mask, is_causal=causal, implementation="cudnn"
    )


def choose_implementation(query: jax.Array, *, dropout_rate: float) -> str:
    """'auto': the fused kernel where the platform has one and the inputs allow it, else 'xla'."""
    if dropout_rate > 0.0:
        return "xla"
    if jax.default_backend() == "gpu" and query.dtype in (jnp.bfloat16, jnp.float16):
        return "cudnn"
    return "xla"


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    *,
    causal: bool = True,
    segment_ids: jax.Array | None = None,
    implementation: str = "auto",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
) -> jax.Array:
    """Multi-head attention over BTNH inputs; returns BTNH with the query's heads.

    implementation: 'auto' | 'xla' | 'cudnn'. Attention dropout (dropout_rate > 0) runs only
    in 'xla'; 'auto' picks it then.
    """
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation {implementation!r} is unknown; choose one of {IMPLEMENTATIONS}."
        )
    if implementation == "auto":
        implementation = choose_implementation(query, dropout_rate=dropout_rate)
    if dropout_rate > 0.0 and implementation != "xla":
        raise ValueError(
            f"attention dropout {dropout_rate} needs implementation='xla' (or 'auto'); "
            f"{implementation!r} has no dropout. Set the model's attention dropout to 0 to use it."
        )
    if implementation == "xla":
        return xla_attention(
            query, key, value, causal=causal, segment_ids=segment_ids,
            dropout_rate=dropout_rate, dropout_rng=dropout_rng,
        )
    return cudnn_attention(query, key, value, causal=causal, segment_ids=segment_ids)
