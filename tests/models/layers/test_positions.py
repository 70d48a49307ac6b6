"""models/layers/positions.py: rotary embeddings against GPT-NeoX's rotate-half RoPE, T5's relative-position
buckets against the formula of transformers' T5Attention._relative_position_bucket, and the bias table."""
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models.llama import Llama3Rotary
from tests.models.layers.references import boxed, init, rotary_reference, t5_bucket_reference


@pytest.mark.parametrize("rotary_dim, base", [(4, 10000.0), (8, 100.0)])
def test_rotary_matches_neox_rotate_half(rotary_dim, base):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 5, 3, 8)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [7, 9, 11, 30, 100]])
    rotary = layers.Rotary(rotary_dim, base)
    got = rotary(jnp.asarray(x), jnp.asarray(positions))
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, rotary_reference(x, positions, rotary_dim, base), rtol=1e-5, atol=2e-5)
    one_row = rotary(jnp.asarray(x), jnp.asarray(positions[1:]))
    np.testing.assert_allclose(one_row, rotary_reference(x, positions[1:], rotary_dim, base), rtol=1e-5, atol=2e-5)
    assert layers.Rotary(rotary_dim).base == 10000.0


@pytest.mark.parametrize("bidirectional, num_buckets, max_distance", [(True, 32, 128), (False, 32, 128),
                                                                      (True, 16, 20)])
def test_relative_position_bucket_matches_t5(bidirectional, num_buckets, max_distance):
    relative = np.arange(-300, 301)[None, :]
    got = layers.relative_position_bucket(jnp.asarray(relative, jnp.int32), bidirectional=bidirectional,
                                          num_buckets=num_buckets, max_distance=max_distance)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, t5_bucket_reference(relative, bidirectional, num_buckets, max_distance))


def test_relative_position_bias_looks_up_its_table_per_bucket_and_head():
    module = layers.RelativePositionBias(num_buckets=8, max_distance=16, num_heads=3, bidirectional=True,
                                         init_std=0.5)
    queries, keys = jnp.array([[0, 1, 2]]), jnp.array([[0, 1, 2, 3, 9]])
    variables = init(module, 0, queries, keys)
    table = boxed(variables)["embedding"]
    assert table.names == ("relpos_buckets", "heads") and table.value.shape == (8, 3)
    buckets = t5_bucket_reference(np.asarray(keys)[:, None, :] - np.asarray(queries)[:, :, None], True, 8, 16)
    expected = np.transpose(np.asarray(table.value)[buckets], (0, 3, 1, 2))
    got = module.apply(variables, queries, keys)
    assert got.shape == (1, 3, 3, 5) and got.dtype == jnp.float32
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("head_dim, base, factor, original", [(128, 500000.0, 8.0, 8192), (64, 10000.0, 4.0, 2048)])
def test_llama3_scaled_frequencies_equal_transformers(head_dim, base, factor, original):
    """Llama 3.1's rope_type 'llama3' (transformers' _compute_llama3_parameters): fp32 rounding apart."""
    pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, max_position_embeddings=4 * original,
                         rope_scaling=dict(rope_type="llama3", rope_theta=base, factor=factor, low_freq_factor=1.0,
                                           high_freq_factor=4.0, original_max_position_embeddings=original))
    theirs, attention_scaling = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    ours = Llama3Rotary(head_dim, base, factor, 1.0, 4.0, original).inverse_frequencies()
    np.testing.assert_allclose(np.asarray(ours), theirs.numpy(), rtol=3e-7)
    assert attention_scaling == 1.0
    plain = np.asarray(layers.Rotary(head_dim, base).inverse_frequencies())
    assert np.asarray(ours)[0] == plain[0] and np.isclose(np.asarray(ours)[-1], plain[-1] / factor, rtol=1e-6)
