"""models/layers/embeddings.py: the lookup table, its use as the output projection, the tied logits' custom
gradient and the vocabulary padding mask."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from tests.models.layers.references import TOL, boxed, init


def test_embed_parameter_lookup_and_output_projection():
    embed = layers.Embed(num_embeddings=512, features=64, axes=("vocab", "embed"), init_std=0.05,
                         dtype=jnp.bfloat16)
    ids = jnp.array([[0, 5, 511]])
    variables = init(embed, 0, ids)
    table = boxed(variables)["embedding"]
    assert table.names == ("vocab", "embed") and table.value.shape == (512, 64) and table.value.dtype == jnp.float32
    assert np.std(table.value) == pytest.approx(0.05, rel=0.03)
    out = embed.apply(variables, ids)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_array_equal(out, table.value[np.array([[0, 5, 511]])].astype(jnp.bfloat16))
    x = jnp.asarray(np.random.default_rng(0).normal(size=(1, 3, 64)), jnp.bfloat16)
    logits = embed.apply(variables, x, method=layers.Embed.attend)
    assert logits.dtype == jnp.float32 and logits.shape == (1, 3, 512)
    reference = np.asarray(x, np.float32) @ np.asarray(table.value.astype(jnp.bfloat16), np.float32).T
    np.testing.assert_allclose(logits, reference, **TOL)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_tied_logits_gradient_equals_autodiff_in_the_operands_dtype(dtype):
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(2, 3, 8)), dtype)
    embedding = jnp.asarray(rng.normal(size=(11, 8)), dtype)
    weights = jnp.asarray(rng.normal(size=(2, 3, 11)), jnp.float32)

    def plain(x, e):
        return jnp.sum(jnp.einsum("bte,ve->btv", x.astype(jnp.float32), e.astype(jnp.float32)) * weights)

    grads = jax.grad(lambda x, e: jnp.sum(layers.tied_logits(x, e) * weights), argnums=(0, 1))(x, embedding)
    expected = jax.grad(plain, argnums=(0, 1))(x, embedding)
    tol = TOL if dtype == jnp.float32 else dict(rtol=2e-2, atol=5e-2)  # bf16 gradient inputs: ~3 digits
    for got, want, operand in zip(grads, expected, (x, embedding)):
        assert got.dtype == operand.dtype and got.shape == operand.shape
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), **tol)


def test_mask_vocab_padding():
    logits = jnp.asarray(np.random.default_rng(16).normal(size=(2, 3, 8)), jnp.float32)
    masked = layers.mask_vocab_padding(logits, 5)
    np.testing.assert_array_equal(masked[..., :5], logits[..., :5])
    assert (np.asarray(masked[..., 5:]) == np.finfo(np.float32).min).all()
