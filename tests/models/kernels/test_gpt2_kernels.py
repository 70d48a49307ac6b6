"""The whole GPT-2 with the Pallas attention and the chunked cross-entropy gives the loss and
gradients of the plain path ('xla' attention, fp32 logits, optax) — alone, and sharded on an
8-device mesh under the 'fsdp_tensor' rules (attention and loss inside shard_map). float32,
tolerance: relative 1e-5 on the loss, max abs 1e-5 × max(1, largest |gradient|) per parameter."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType

from models.gpt2 import GPT2, GPT2Config
from models.kernels.cross_entropy import chunked_cross_entropy
from partitioning.partitioner import Partitioner

CONFIG = GPT2Config(vocab_size=100, max_len=32, num_layers=2, num_heads=2, embed_dim=128,
                    mlp_dim=256, dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")


def batch():
    """4 rows (so data x fsdp = 4 splits them): two packed documents and a padding tail each."""
    tokens = jax.random.randint(jax.random.key(1), (4, 32), 0, CONFIG.vocab_size)
    segment_ids = jnp.asarray(np.repeat([[1] * 20 + [2] * 9 + [0] * 3], 4, axis=0), jnp.int32)
    positions = jnp.asarray([list(range(20)) + list(range(9)) + [0] * 3] * 4, jnp.int32)
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


@pytest.fixture(scope="module")
def boxed_params():
    return GPT2(CONFIG).init(jax.random.key(0), batch()[0])["params"]


@pytest.fixture(scope="module")
def plain(boxed_params):
    return jax.jit(jax.value_and_grad(plain_loss))(nn.meta.unbox(boxed_params), *batch())


def assert_same(got, want):
    (got_loss, got_grads), (want_loss, want_grads) = got, want
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
    flat_want = dict(jax.tree_util.tree_leaves_with_path(want_grads))
    for path, g in jax.tree_util.tree_leaves_with_path(got_grads):
        w = flat_want[path]
        assert np.isfinite(np.asarray(g)).all(), jax.tree_util.keystr(path)
        np.testing.assert_allclose(g, w, rtol=0, err_msg=jax.tree_util.keystr(path),
                                   atol=1e-5 * max(1.0, float(jnp.max(jnp.abs(w)))))


def test_pallas_attention_and_chunked_loss_match_the_plain_model(boxed_params, plain):
    got = jax.jit(jax.value_and_grad(kernel_loss))(nn.meta.unbox(boxed_params), *batch())
    assert_same(got, plain)


@pytest.mark.integration
def test_sharded_over_data_fsdp_tensor_matches_the_plain_model(boxed_params, plain):
    mesh = jax.make_mesh((2, 1, 2, 1, 2), ("data", "stage", "fsdp", "expert", "tensor"),
                         axis_types=(AxisType.Auto,) * 5)
    partitioner = Partitioner(mesh, "fsdp_tensor")
    params = nn.meta.unbox(boxed_params)  # outside the mesh: unbox would constrain inside it
    with partitioner.activate():
        params = jax.device_put(params, partitioner.shardings(nn.get_partition_spec(boxed_params)))
        got = jax.jit(jax.value_and_grad(kernel_loss))(params, *batch())
    assert_same(got, plain)
