"""Cross-entropy over a tied output embedding without materialising [batch, length, vocab] logits.

`chunked_cross_entropy` walks the sequence in chunks of `chunk_size` positions: each step forms
that chunk's fp32 logits (hidden @ embedding.T), reduces them to a log-sum-exp and the target
logit, and drops them, so peak memory holds batch × chunk_size × vocab logits instead of
batch × length × vocab (the unfused loss keeps all of them, in fp32, for its backward).

Gradients (custom VJP): with z_loss == 0 the forward pass under differentiation also forms each
chunk's gradients for a unit cotangent (the loss is linear in it) and the backward rescales them —
three matmuls per chunk, the unfused loss's count. With z_loss > 0 the two outputs' cotangents
are only known in the backward, which recomputes each chunk's logits from the saved per-token
log-sum-exp (four matmuls). Without differentiation only the forward reduction runs.

`chunked_token_scores` is the evaluation counterpart: per-token log-probabilities and argmax hits
over the same chunks and sharding, without gradients.

Under a mesh (read from the ambient `jax.set_mesh` and the Flax logical-axis rules) it runs inside
`jax.shard_map`, vocabulary-parallel as in Megatron: each shard holds the embedding rows of its
slice of the vocabulary ('vocab' -> 'tensor' in the default rules) and the batch rows of its
'activation_batch' slice; the softmax statistics are all-reduced as [batch, chunk] values, the
hidden-state gradient once per chunk, and the embedding gradient once at the end. Rows at or past
`vocab_size` (vocabulary padding) take no probability mass.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from models.kernels.sharding import active_mesh, axes_size, mesh_axes


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static settings of one loss call; the axes are the shard_map axes it runs under (or ())."""

    vocab_size: int
    z_loss: float
    chunk_size: int
    batch_axes: tuple[str, ...] = ()
    vocab_axes: tuple[str, ...] = ()


def over(collective, x, axes: tuple[str, ...]):
    """collective(x, axes), or x when nothing is split."""
    return collective(x, axes) if axes else x


def chunk_logits(h: jax.Array, embedding: jax.Array, layout: Layout):
    """fp32 logits [batch, chunk, local vocab] (padding ids at the float32 minimum) and vocab ids."""
    logits = jnp.einsum("bce,ve->bcv", h, embedding, preferred_element_type=jnp.float32)
    offset = lax.axis_index(layout.vocab_axes) * embedding.shape[0] if layout.vocab_axes else 0
    ids = offset + lax.broadcasted_iota(jnp.int32, logits.shape, 2)
    return jnp.where(ids < layout.vocab_size, logits, jnp.finfo(jnp.float32).min), ids


def in_chunks(x: jax.Array, chunk_size: int) -> jax.Array:
    """[batch, length, ...] (length a multiple of chunk_size) -> [chunks, batch, chunk_size, ...]."""
    batch, length = x.shape[:2]
    x = x.reshape(batch, length // chunk_size, chunk_size, *x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def from_chunks(x: jax.Array) -> jax.Array:
    """Inverse of in_chunks."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def softmax_stats(logits, ids, targets, layout: Layout):
    """Per token: log-sum-exp over the whole vocabulary and the target's logit (fp32 [batch, chunk])."""
    row_max = over(lax.pmax, jnp.max(logits, axis=-1), layout.vocab_axes)
    sum_exp = over(lax.psum, jnp.sum(jnp.exp(logits - row_max[..., None]), axis=-1), layout.vocab_axes)
    target_logit = jnp.sum(jnp.where(ids == targets[..., None], logits, 0.0), axis=-1)
    return row_max + jnp.log(sum_exp), over(lax.psum, target_logit, layout.vocab_axes)


def chunk_gradients(layout: Layout, h, embedding, logits, ids, t, w, lse, g_loss, g_z):
    """d hidden (all-reduced over the vocabulary) and this shard's d embedding for one chunk, from
    d logits = w·[(g_loss + 2·z·g_z·lse)·softmax − g_loss·onehot]."""
    probs = jnp.exp(logits - lse[..., None])
    scale = w * (g_loss + 2.0 * layout.z_loss * g_z * lse)
    target_term = jnp.where(ids == t[..., None], (w * g_loss)[..., None], 0.0)
    d_logits = (scale[..., None] * probs - target_term).astype(h.dtype)
    d_h = jnp.einsum("bcv,ve->bce", d_logits, embedding, preferred_element_type=jnp.float32)
    d_embedding = jnp.einsum("bcv,bce->ve", d_logits, h, preferred_element_type=jnp.float32)
    return over(lax.psum, d_h, layout.vocab_axes).astype(h.dtype), d_embedding


def forward_local(layout: Layout, hidden, embedding, targets, weights):
    """Per shard: the two sums (all-reduced) and per-token log-sum-exp and lse - target logit."""

    def one_chunk(_, chunk):
        h, t = chunk
        logits, ids = chunk_logits(h, embedding, layout)
        lse, target_logit = softmax_stats(logits, ids, t, layout)
        return None, (lse, lse - target_logit)

    _, (lse, nll) = lax.scan(one_chunk, None, (in_chunks(hidden, layout.chunk_size),
                                               in_chunks(targets, layout.chunk_size)))
    lse, nll = from_chunks(lse), from_chunks(nll)
    loss_sum = over(lax.psum, jnp.sum(weights * nll), layout.batch_axes)
    z_loss_sum = layout.z_loss * over(lax.psum, jnp.sum(weights * lse**2), layout.batch_axes)
    return loss_sum, z_loss_sum, lse, nll


def scores_local(layout: Layout, hidden, embedding, targets):
    """Per shard: per token, log p(target) and whether the target is the argmax (the first id of
    the largest logit, as jnp.argmax picks it)."""

    def one_chunk(_, chunk):
        h, t = chunk
        logits, ids = chunk_logits(h, embedding, layout)
        lse, target_logit = softmax_stats(logits, ids, t, layout)
        row_max = over(lax.pmax, jnp.max(logits, axis=-1), layout.vocab_axes)
        first_max = jnp.min(jnp.where(logits == row_max[..., None], ids, jnp.iinfo(jnp.int32).max), axis=-1)
        return None, (target_logit - lse, over(lax.pmin, first_max, layout.vocab_axes) == t)

    _, (log_prob, correct) = lax.scan(one_chunk, None, (in_chunks(hidden, layout.chunk_size),
                                                        in_chunks(targets, layout.chunk_size)))
    return from_chunks(log_prob), from_chunks(correct)


def forward_with_gradients_local(layout: Layout, hidden, embedding, targets, weights):
    """Per shard, z_loss == 0: the loss sum and its gradients for a unit cotangent in one pass.

    The loss is linear in its cotangent, so the backward only rescales these: three matmuls per
    chunk in all, as the unfused loss, instead of four with the logits recomputed.
    """

    def one_chunk(d_embedding, chunk):
        h, t, w = chunk
        logits, ids = chunk_logits(h, embedding, layout)
        lse, target_logit = softmax_stats(logits, ids, t, layout)
        d_h, d_e = chunk_gradients(layout, h, embedding, logits, ids, t, w, lse, 1.0, 0.0)
        return d_embedding + d_e, (lse - target_logit, d_h)

    chunks = tuple(in_chunks(x, layout.chunk_size) for x in (hidden, targets, weights))
    d_embedding, (nll, d_hidden) = lax.scan(one_chunk, jnp.zeros(embedding.shape, jnp.float32), chunks)
    nll = from_chunks(nll)
    loss_sum = over(lax.psum, jnp.sum(weights * nll), layout.batch_axes)
    d_embedding = over(lax.psum, d_embedding, layout.batch_axes).astype(embedding.dtype)
    return loss_sum, nll, from_chunks(d_hidden), d_embedding


def backward_local(layout: Layout, hidden, embedding, targets, weights, lse, nll, g_loss, g_z):
    """Per shard, z_loss > 0: the gradients, recomputing each chunk's logits."""

    def one_chunk(d_embedding, chunk):
        h, t, w, chunk_lse = chunk
        logits, ids = chunk_logits(h, embedding, layout)
        d_h, d_e = chunk_gradients(layout, h, embedding, logits, ids, t, w, chunk_lse, g_loss, g_z)
        return d_embedding + d_e, d_h

    chunks = tuple(in_chunks(x, layout.chunk_size) for x in (hidden, targets, weights, lse))
    d_embedding, d_hidden = lax.scan(one_chunk, jnp.zeros(embedding.shape, jnp.float32), chunks)
    d_embedding = over(lax.psum, d_embedding, layout.batch_axes).astype(embedding.dtype)
    d_weights = g_loss * nll + g_z * layout.z_loss * lse**2
    return from_chunks(d_hidden), d_embedding, d_weights


def per_shard(fn, layout: Layout, in_specs, out_specs):
    """fn under shard_map over the ambient mesh when the layout splits anything, else fn itself."""
    fn = functools.partial(fn, layout)
    if not (layout.batch_axes or layout.vocab_axes):
        return fn
    mesh = jax.sharding.get_abstract_mesh()
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                         axis_names=frozenset(mesh.auto_axes), check_vma=False)


def specs(layout: Layout):
    """PartitionSpecs of a [batch, length, ...] array, the embedding, and a replicated scalar."""
    batch = P(layout.batch_axes or None)
    return batch, P(layout.vocab_axes or None, None), P()


def sums_and_statistics(layout: Layout):
    """forward_local, per shard under a mesh."""
    batch, table, scalar = specs(layout)
    return per_shard(forward_local, layout, (batch, table, batch, batch), (scalar, scalar, batch, batch))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def fused_loss(layout: Layout, hidden, embedding, targets, weights):
    return sums_and_statistics(layout)(hidden, embedding, targets, weights)[:2]


def fused_loss_fwd(layout: Layout, hidden, embedding, targets, weights):
    batch, table, scalar = specs(layout)
    if layout.z_loss == 0.0:
        forward = per_shard(forward_with_gradients_local, layout, (batch, table, batch, batch),
                            (scalar, batch, batch, table))
        loss_sum, nll, d_hidden, d_embedding = forward(hidden, embedding, targets, weights)
        return (loss_sum, jnp.zeros((), jnp.float32)), (nll, d_hidden, d_embedding)
    loss_sum, z_loss_sum, lse, nll = sums_and_statistics(layout)(hidden, embedding, targets, weights)
    return (loss_sum, z_loss_sum), (hidden, embedding, targets, weights, lse, nll)


def fused_loss_bwd(layout: Layout, residuals, cotangents):
    g_loss, g_z = cotangents
    if layout.z_loss == 0.0:  # gradients came with the forward; z_loss_sum is the constant 0
        nll, d_hidden, d_embedding = residuals
        return ((g_loss * d_hidden).astype(d_hidden.dtype), (g_loss * d_embedding).astype(d_embedding.dtype),
                None, g_loss * nll)
    batch, table, scalar = specs(layout)
    backward = per_shard(backward_local, layout, (batch, table, batch, batch, batch, batch, scalar, scalar),
                         (batch, table, batch))
    d_hidden, d_embedding, d_weights = backward(*residuals, g_loss, g_z)
    return d_hidden, d_embedding, None, d_weights


fused_loss.defvjp(fused_loss_fwd, fused_loss_bwd)


def pad_length(x: jax.Array, length: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, length - x.shape[1])
    return jnp.pad(x, widths)


def sharded_layout(vocab_size: int, z_loss: float, chunk_size: int, batch: int, padded_vocab: int) -> Layout:
    """The Layout for the ambient mesh and rules: batch over 'activation_batch', rows over 'vocab'."""
    mesh = active_mesh()
    layout = Layout(vocab_size, z_loss, chunk_size)
    if mesh is None:
        return layout
    batch_axes = mesh_axes("activation_batch", mesh, batch)
    vocab_axes = tuple(a for a in mesh_axes("vocab", mesh, padded_vocab) if a not in batch_axes)
    if padded_vocab % axes_size(mesh, vocab_axes):
        vocab_axes = ()
    return dataclasses.replace(layout, batch_axes=batch_axes, vocab_axes=vocab_axes)


def padded_to_chunks(chunk_size: int, *arrays: jax.Array) -> tuple[int, list[jax.Array]]:
    """(the chunk size for this length, the [batch, length, ...] arrays padded to a multiple of it)."""
    chunk_size = min(chunk_size, arrays[0].shape[1])
    length = -(-arrays[0].shape[1] // chunk_size) * chunk_size
    return chunk_size, [pad_length(x, length) if length != x.shape[1] else x for x in arrays]


def check_table(embedding: jax.Array, vocab_size: int) -> None:
    if embedding.shape[0] < vocab_size:
        raise ValueError(
            f"embedding has {embedding.shape[0]} rows but vocab_size is {vocab_size}; pass the "
            "padded table (rows >= vocab_size are padding) and the real vocabulary size."
        )


def chunked_token_scores(hidden: jax.Array, embedding: jax.Array, targets: jax.Array, *, vocab_size: int,
                         chunk_size: int = 256) -> tuple[jax.Array, jax.Array]:
    """Per token (fp32 [batch, length], bool [batch, length]): log p(target) under
    softmax(hidden @ embedding.T) over the real vocabulary, and whether the target is the argmax.
    For evaluation: no gradient, and only batch × chunk_size × vocab logits live at once."""
    check_table(embedding, vocab_size)
    length = hidden.shape[1]
    chunk_size, (hidden, targets) = padded_to_chunks(chunk_size, hidden, targets)
    layout = sharded_layout(vocab_size, 0.0, chunk_size, hidden.shape[0], embedding.shape[0])
    batch, table, _ = specs(layout)
    scores = per_shard(scores_local, layout, (batch, table, batch), (batch, batch))
    log_prob, correct = scores(hidden, embedding.astype(hidden.dtype), targets.astype(jnp.int32))
    return log_prob[:, :length], correct[:, :length]


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

    hidden [batch, length, embed] (compute dtype), embedding [padded_vocab, embed] (cast to
    hidden's dtype for the matmuls, as Embed.attend does; its gradient comes back in its own
    dtype), targets int [batch, length], weights float32 [batch, length]. Ids >= vocab_size are padding and get no
    probability mass. chunk_size: sequence positions per step; one step holds
    (local) batch × chunk_size × (local) padded_vocab fp32 logits. Lengths are padded up to a
    multiple of it with weight 0.
    """
    check_table(embedding, vocab_size)
    chunk_size, (hidden, targets, weights) = padded_to_chunks(chunk_size, hidden, targets, weights)
    layout = sharded_layout(vocab_size, float(z_loss), chunk_size, hidden.shape[0], embedding.shape[0])
    return fused_loss(layout, hidden, embedding.astype(hidden.dtype), targets.astype(jnp.int32),
                      weights.astype(jnp.float32))
