"""Lookup tables and the output head: an embedding table serves as the input lookup and, tied or as its
own table, as the output projection (the chunked cross-entropy takes either as a table [vocab, embed])."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers.dense import BATCH_LENGTH_VOCAB, normal_param


class Embed(nn.Module):
    """A lookup table [num_embeddings, features] named by `axes`; `attend` is the output projection."""

    num_embeddings: int
    features: int
    axes: tuple[str | None, str]
    init_std: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = normal_param(self, "embedding", self.init_std, (self.num_embeddings, self.features),
                                      self.axes, self.param_dtype)

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


def mask_vocab_padding(logits: jax.Array, vocab_size: int) -> jax.Array:
    """Logits [batch, length, padded_vocab] with the ids at or past vocab_size at the float32 minimum,
    so that padding rows never take probability."""
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, jnp.finfo(jnp.float32).min)
    return nn.with_logical_constraint(logits, BATCH_LENGTH_VOCAB)
