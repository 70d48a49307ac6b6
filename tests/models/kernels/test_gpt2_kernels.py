"""The whole GPT-2 with the Pallas attention and the chunked cross-entropy gives the loss and
gradients of the plain path ('xla' attention, fp32 logits, optax). float32, tolerance: relative
1e-5 on the loss, max abs 1e-5 × max(1, largest |gradient|) per parameter."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from models.gpt2 import GPT2, GPT2Config
from models.kernels.cross_entropy import chunked_cross_entropy

CONFIG = GPT2Config(vocab_size=100, max_len=32, num_layers=2, num_heads=2, embed_dim=128,
                    mlp_dim=256, dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")


def batch():
    tokens = jax.random.randint(jax.random.key(1), (2, 32), 0, CONFIG.vocab_size)
    segment_ids = jnp.asarray(np.repeat([[1] * 20 + [2] * 9 + [0] * 3], 2, axis=0), jnp.int32)
    positions = jnp.asarray([list(range(20)) + list(range(9)) + [0] * 3] * 2, jnp.int32)
    targets = jnp.roll(tokens, -1, axis=1)
    weights = (segment_ids != 0).astype(jnp.float32).at[:, -1].set(0.0)
    return tokens, positions, segment_ids, targets, weights


def plain_loss(params, tokens, positions, segment_ids, targets, weights):
    model = GPT2(dataclasses.replace(CONFIG, attention="xla"))
    logits = model.apply({"params": params}, tokens, positions=positions, segment_ids=segment_ids)
    return jnp.sum(weights * optax.softmax_cross_entropy_with_integer_labels(logits, targets))


def kernel_loss(params, tokens, positions, segment_ids, targets, weights):
    model = GPT2(dataclasses.replace(CONFIG, attention="pallas"))
    hidden, embedding = model.apply({"params": params}, tokens, positions=positions,
                                    segment_ids=segment_ids, return_hidden=True)
    loss, _ = chunked_cross_entropy(hidden, embedding, targets, weights,
                                    vocab_size=CONFIG.vocab_size, chunk_size=16)
    return loss


def test_pallas_attention_and_chunked_loss_match_the_plain_model():
    data = batch()
    params = GPT2(CONFIG).init(jax.random.key(0), data[0])["params"]
    want_loss, want_grads = jax.jit(jax.value_and_grad(plain_loss))(params, *data)
    got_loss, got_grads = jax.jit(jax.value_and_grad(kernel_loss))(params, *data)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    flat_want = dict(jax.tree_util.tree_leaves_with_path(want_grads))
    for path, got in jax.tree_util.tree_leaves_with_path(got_grads):
        want = flat_want[path]
        assert np.isfinite(np.asarray(got)).all(), jax.tree_util.keystr(path)
        np.testing.assert_allclose(got, want, rtol=0, err_msg=jax.tree_util.keystr(path),
                                   atol=1e-5 * max(1.0, float(jnp.max(jnp.abs(want)))))
