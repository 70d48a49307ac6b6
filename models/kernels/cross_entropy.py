"""Cross-entropy over a tied output embedding without materialising [batch, length, vocab] logits.

`chunked_cross_entropy` walks the sequence in chunks of `chunk_size` positions: each step forms
that chunk's fp32 logits (hidden @ embedding.T), reduces them to a log-sum-exp and the target
logit, and drops them. The custom VJP saves only the per-token log-sum-exp and recomputes each
chunk's logits in the backward pass, so peak memory holds batch × chunk_size × vocab logits instead
of batch × length × vocab (the unfused loss keeps the full fp32 logits alive for its backward).

Vocabulary-parallel under a mesh: each chunk's logits carry the logical axes (activation_batch,
activation_length, activation_vocab), so with the default rules (vocab -> 'tensor') every tensor
shard computes logits for its slice of the embedding rows, and the softmax reductions become small
all-reduces of [batch, chunk] values; the target logit is a masked sum, never a gather across
shards. Rows at or past `vocab_size` (vocabulary padding) take no probability mass.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

LOGITS_AXES = ("activation_batch", "activation_length", "activation_vocab")


def chunk_logits(hidden: jax.Array, embedding: jax.Array, vocab_size: int) -> jax.Array:
    """fp32 logits [batch, chunk, padded_vocab] with padding ids at the float32 minimum."""
    logits = jnp.einsum("bce,ve->bcv", hidden, embedding, preferred_element_type=jnp.float32)
    logits = nn.with_logical_constraint(logits, LOGITS_AXES)
    real = lax.broadcasted_iota(jnp.int32, logits.shape, 2) < vocab_size
    return jnp.where(real, logits, jnp.finfo(jnp.float32).min)


def is_target(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Boolean [batch, chunk, vocab]: True at each token's target id (shards with the vocab)."""
    return lax.broadcasted_iota(jnp.int32, logits.shape, 2) == targets[..., None]


def in_chunks(x: jax.Array, chunk_size: int) -> jax.Array:
    """[batch, length, ...] (length a multiple of chunk_size) -> [chunks, batch, chunk_size, ...]."""
    batch, length = x.shape[:2]
    x = x.reshape(batch, length // chunk_size, chunk_size, *x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def from_chunks(x: jax.Array) -> jax.Array:
    """Inverse of in_chunks."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def token_terms(hidden, embedding, targets, *, vocab_size, chunk_size):
    """Per-token (log-sum-exp, log-sum-exp - target logit), both fp32 [batch, length]."""

    def one_chunk(_, chunk):
        h, t = chunk
        logits = chunk_logits(h, embedding, vocab_size)
        lse = jax.nn.logsumexp(logits, axis=-1)
        target_logit = jnp.sum(jnp.where(is_target(logits, t), logits, 0.0), axis=-1)
        return None, (lse, lse - target_logit)

    chunks = (in_chunks(hidden, chunk_size), in_chunks(targets, chunk_size))
    _, (lse, nll) = lax.scan(one_chunk, None, chunks)
    return from_chunks(lse), from_chunks(nll)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def fused_loss(hidden, embedding, targets, weights, vocab_size, z_loss, chunk_size):
    lse, nll = token_terms(hidden, embedding, targets, vocab_size=vocab_size, chunk_size=chunk_size)
    return jnp.sum(weights * nll), z_loss * jnp.sum(weights * lse**2)


def fused_loss_fwd(hidden, embedding, targets, weights, vocab_size, z_loss, chunk_size):
    lse, nll = token_terms(hidden, embedding, targets, vocab_size=vocab_size, chunk_size=chunk_size)
    sums = jnp.sum(weights * nll), z_loss * jnp.sum(weights * lse**2)
    return sums, (hidden, embedding, targets, weights, lse, nll)


def fused_loss_bwd(vocab_size, z_loss, chunk_size, residuals, cotangents):
    """d logits = w * [(g_loss + 2 z g_z lse) * softmax - g_loss * onehot], chunk by chunk."""
    hidden, embedding, targets, weights, lse, nll = residuals
    g_loss, g_z = cotangents

    def one_chunk(d_embedding, chunk):
        h, t, w, chunk_lse = chunk
        logits = chunk_logits(h, embedding, vocab_size)
        probs = jnp.exp(logits - chunk_lse[..., None])
        scale = w * (g_loss + 2.0 * z_loss * g_z * chunk_lse)
        d_logits = scale[..., None] * probs - jnp.where(is_target(logits, t), (w * g_loss)[..., None], 0.0)
        d_logits = d_logits.astype(h.dtype)
        d_h = jnp.einsum("bcv,ve->bce", d_logits, embedding, preferred_element_type=jnp.float32)
        d_embedding += jnp.einsum("bcv,bce->ve", d_logits, h, preferred_element_type=jnp.float32)
        return d_embedding, d_h.astype(h.dtype)

    chunks = tuple(in_chunks(x, chunk_size) for x in (hidden, targets, weights, lse))
    d_embedding, d_hidden = lax.scan(one_chunk, jnp.zeros(embedding.shape, jnp.float32), chunks)
    d_weights = g_loss * nll + g_z * z_loss * lse**2
    return from_chunks(d_hidden), d_embedding.astype(embedding.dtype), None, d_weights


fused_loss.defvjp(fused_loss_fwd, fused_loss_bwd)


def pad_length(x: jax.Array, length: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, length - x.shape[1])
    return jnp.pad(x, widths)


def chunked_cross_entropy(
    hidden: jax.Array,
    embedding: jax.Array,
    targets: jax.Array,
    weights: jax.Array,
    *,
    vocab_size: int,
    z_loss: float = 0.0,
    chunk_size: int = 256,
) -> tuple[jax.Array, jax.Array]:
    """(Σ w·(logsumexp − logit[target]), z_loss·Σ w·logsumexp²) with logits = hidden @ embedding.T.

    hidden [batch, length, embed] (compute dtype), embedding [padded_vocab, embed], targets int
    [batch, length], weights float32 [batch, length]. Ids >= vocab_size are padding and get no
    probability mass. chunk_size: sequence positions per step; one step holds
    batch × chunk_size × padded_vocab fp32 logits. Lengths are padded up to a multiple of it with
    weight 0.
    """
    if embedding.shape[0] < vocab_size:
        raise ValueError(
            f"embedding has {embedding.shape[0]} rows but vocab_size is {vocab_size}; pass the "
            "padded table (rows >= vocab_size are padding) and the real vocabulary size."
        )
    chunk_size = min(chunk_size, hidden.shape[1])
    length = -(-hidden.shape[1] // chunk_size) * chunk_size
    if length != hidden.shape[1]:
        hidden, targets, weights = (pad_length(x, length) for x in (hidden, targets, weights))
    return fused_loss(hidden, embedding, targets.astype(jnp.int32), weights.astype(jnp.float32),
                      vocab_size, float(z_loss), chunk_size)
