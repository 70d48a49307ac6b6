"""chunked_cross_entropy against optax on the unpadded vocabulary, forward and backward, and
chunked_token_scores against log_softmax / argmax of the full logits.

Tolerances (gradient ones are multiplied by max(1, largest |gradient|)):
  float32: relative 1e-5 on the sums, abs 1e-5 on gradients (reference at HIGHEST matmul precision);
  bfloat16 hidden/embedding vs a float32 reference on the same rounded values: relative 1e-2 on the
  sums, abs 1e-2 on gradients (they come back in bfloat16, one ulp = 2^-8 relative).
"""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from models.kernels.cross_entropy import chunked_cross_entropy, chunked_token_scores

VOCAB, PADDED_VOCAB, EMBED = 50, 64, 32


def problem(seed, batch, length, dtype=jnp.float32):
    kh, ke, kt, kw = jax.random.split(jax.random.key(seed), 4)
    hidden = jax.random.normal(kh, (batch, length, EMBED)).astype(dtype)
    embedding = jax.random.normal(ke, (PADDED_VOCAB, EMBED)).astype(dtype)
    embedding = embedding.at[VOCAB:].set(30.0)  # padding rows with huge logits: must take no mass
    targets = jax.random.randint(kt, (batch, length), 0, VOCAB)
    weights = (jax.random.uniform(kw, (batch, length)) > 0.2).astype(jnp.float32)
    return hidden, embedding, targets, weights


def reference(hidden, embedding, targets, weights, z_loss):
    logits = jnp.einsum("bte,ve->btv", hidden.astype(jnp.float32),
                        embedding[:VOCAB].astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return jnp.sum(weights * nll), z_loss * jnp.sum(weights * lse**2)


def fused(z_loss, chunk_size):
    return lambda h, e, t, w: chunked_cross_entropy(h, e, t, w, vocab_size=VOCAB, z_loss=z_loss,
                                                    chunk_size=chunk_size)


def sums_and_grads(loss_fn, hidden, embedding, targets, weights):
    def total(h, e, w):
        loss, z = loss_fn(h, e, targets, w)
        return 0.7 * loss + 0.5 * z, (loss, z)  # distinct, non-unit cotangents on the two outputs

    (_, sums), grads = jax.jit(jax.value_and_grad(total, argnums=(0, 1, 2), has_aux=True))(
        hidden, embedding, weights)
    return sums, list(grads)


def assert_matches(got, want, sum_rtol, grad_atol):
    (got_sums, got_grads), (want_sums, want_grads) = got, want
    for g, w in zip(got_sums, want_sums):
        np.testing.assert_allclose(g, w, rtol=sum_rtol, atol=1e-6)
    for name, g, w in zip(("hidden", "embedding", "weights"), got_grads, want_grads):
        g, w = g.astype(jnp.float32), w.astype(jnp.float32)
        assert np.isfinite(np.asarray(g)).all(), name
        np.testing.assert_allclose(g, w, atol=grad_atol * max(1.0, float(jnp.max(jnp.abs(w)))),
                                   rtol=0, err_msg=name)


@pytest.mark.parametrize("z_loss, length, chunk_size", [(0.0, 24, 8), (1e-4, 21, 8), (0.1, 16, 64)])
def test_float32_equals_optax(z_loss, length, chunk_size):
    hidden, embedding, targets, weights = problem(length, 3, length)
    got = sums_and_grads(fused(z_loss, chunk_size), hidden, embedding, targets, weights)
    want = sums_and_grads(lambda h, e, t, w: reference(h, e, t, w, z_loss), hidden, embedding,
                          targets, weights)
    assert_matches(got, want, sum_rtol=1e-5, grad_atol=1e-5)
    z_loss_sum = float(got[0][1])
    assert (z_loss_sum == 0.0) if z_loss == 0.0 else (z_loss_sum > 0.0)
    np.testing.assert_array_equal(got[1][1][VOCAB:], 0.0)  # padding rows get no gradient


def test_bfloat16_equals_optax_on_the_rounded_inputs():
    """bf16 hidden with a float32 table (bf16-exact values): matmuls in bf16, table gradient in fp32."""
    hidden, embedding, targets, weights = problem(1, 2, 32, jnp.bfloat16)
    embedding = embedding.astype(jnp.float32)
    got = sums_and_grads(fused(1e-4, 16), hidden, embedding, targets, weights)
    want = sums_and_grads(lambda h, e, t, w: reference(h, e, t, w, 1e-4), hidden, embedding,
                          targets, weights)
    assert_matches(got, want, sum_rtol=1e-2, grad_atol=1e-2)
    assert got[1][1].dtype == jnp.float32


@pytest.mark.parametrize("z_loss", [0.0, 1e-4])  # gradients in the forward pass / recomputed
def test_vocabulary_parallel_under_a_mesh_equals_unsharded(z_loss):
    """Embedding rows over 'tensor', batch over 'data', inside shard_map: the sums and gradients of
    the unsharded loss, with no all-gather (only [batch, chunk] / d_hidden / d_embedding all-reduces)."""
    mesh = jax.make_mesh((2, 1, 1, 1, 4), ("data", "stage", "fsdp", "expert", "tensor"),
                         axis_types=(AxisType.Auto,) * 5)
    rules = [("activation_batch", ("data", "fsdp")), ("activation_length", None), ("vocab", "tensor")]
    hidden, embedding, targets, weights = problem(9, 2, 16)
    want = sums_and_grads(fused(z_loss, 8), hidden, embedding, targets, weights)
    batch = NamedSharding(mesh, P("data"))
    hidden, targets, weights = (jax.device_put(x, batch) for x in (hidden, targets, weights))
    embedding = jax.device_put(embedding, NamedSharding(mesh, P("tensor", None)))
    loss = lambda h, e, w: sum(fused(z_loss, 8)(h, e, targets, w))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        got = sums_and_grads(fused(z_loss, 8), hidden, embedding, targets, weights)
        hlo = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(hidden, embedding, weights).compile().as_text()
    assert_matches(got, want, sum_rtol=1e-5, grad_atol=1e-5)
    assert "all-reduce" in hlo and "all-gather" not in hlo


def test_rejects_an_embedding_smaller_than_the_vocabulary():
    hidden, embedding, targets, weights = problem(0, 1, 8)
    with pytest.raises(ValueError, match="vocab_size is 100"):
        chunked_cross_entropy(hidden, embedding, targets, weights, vocab_size=100)


def reference_scores(hidden, embedding, targets):
    logits = jnp.einsum("bte,ve->btv", hidden.astype(jnp.float32),
                        embedding[:VOCAB].astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], axis=-1)[..., 0]
    return log_prob, jnp.argmax(logits, axis=-1) == targets


def with_argmax_targets(hidden, embedding, targets):
    """Every third target replaced by the argmax, so that 'correct' is tested both ways."""
    logits = jnp.einsum("bte,ve->btv", hidden, embedding[:VOCAB], precision=jax.lax.Precision.HIGHEST)
    return targets.at[:, ::3].set(jnp.argmax(logits, axis=-1)[:, ::3])


@pytest.mark.parametrize("length, chunk_size", [(24, 8), (21, 8), (16, 64)])
def test_token_scores_equal_the_full_logits(length, chunk_size):
    """log p(target) within 1e-5 absolute (float32); 'correct' exactly argmax == target."""
    hidden, embedding, targets, _ = problem(3, 2, length)
    targets = with_argmax_targets(hidden, embedding, targets)
    log_prob, correct = chunked_token_scores(hidden, embedding, targets, vocab_size=VOCAB, chunk_size=chunk_size)
    want_log_prob, want_correct = reference_scores(hidden, embedding, targets)
    assert log_prob.shape == correct.shape == targets.shape
    np.testing.assert_allclose(log_prob, want_log_prob, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(correct, want_correct)
    assert 0 < int(correct.sum()) < correct.size


def test_token_scores_take_the_first_of_tied_maxima_as_argmax_does():
    hidden = jnp.ones((1, 2, EMBED))
    embedding = jnp.zeros((PADDED_VOCAB, EMBED)).at[VOCAB:].set(30.0)  # every real logit ties at 0
    log_prob, correct = chunked_token_scores(hidden, embedding, jnp.array([[0, 7]]), vocab_size=VOCAB)
    np.testing.assert_array_equal(correct, [[True, False]])
    np.testing.assert_allclose(log_prob, np.full((1, 2), -np.log(VOCAB)), rtol=1e-6)


def test_token_scores_under_a_mesh_equal_unsharded():
    """Vocabulary over 'tensor' (4 shards: the argmax and the target live on different shards) and
    batch over 'data': the same scores, with no all-gather of the logits or the table."""
    mesh = jax.make_mesh((2, 1, 1, 1, 4), ("data", "stage", "fsdp", "expert", "tensor"), axis_types=(AxisType.Auto,) * 5)
    rules = [("activation_batch", ("data", "fsdp")), ("activation_length", None), ("vocab", "tensor")]
    hidden, embedding, targets, _ = problem(11, 2, 16)
    targets = with_argmax_targets(hidden, embedding, targets)
    want = chunked_token_scores(hidden, embedding, targets, vocab_size=VOCAB, chunk_size=8)
    batch = NamedSharding(mesh, P("data"))
    hidden, targets = (jax.device_put(x, batch) for x in (hidden, targets))
    embedding = jax.device_put(embedding, NamedSharding(mesh, P("tensor", None)))
    scores = jax.jit(lambda h, e, t: chunked_token_scores(h, e, t, vocab_size=VOCAB, chunk_size=8))
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        got = scores(hidden, embedding, targets)
        hlo = scores.lower(hidden, embedding, targets).compile().as_text()
    np.testing.assert_allclose(got[0], want[0], atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got[1], want[1])
    assert "all-reduce" in hlo and "all-gather" not in hlo
