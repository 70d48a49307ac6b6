"""models/layers/norms.py: LayerNorm and RMSNorm against numpy, statistics in fp32 whatever the dtype."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from tests.models.layers.references import TOL, boxed, init, perturbed, values


@pytest.mark.parametrize("norm, centered", [(layers.LayerNorm, True), (layers.RMSNorm, False)])
def test_norm_matches_numpy(norm, centered):
    module = norm(epsilon=1e-3)
    x = (np.random.default_rng(3).normal(size=(2, 3, 6)) * 4 + 1).astype(np.float32)
    variables = init(module, 0, x)
    params = boxed(variables)
    assert sorted(params) == (["bias", "scale"] if centered else ["scale"])
    assert all(p.names == ("embed",) for p in params.values())
    np.testing.assert_array_equal(params["scale"].value, np.ones(6))
    variables = perturbed(variables, 1)
    p = values(variables)
    y = x - x.mean(-1, keepdims=True) if centered else x
    y = y / np.sqrt(np.square(y).mean(-1, keepdims=True) + 1e-3) * p["scale"] + p.get("bias", 0.0)
    np.testing.assert_allclose(module.apply(variables, x), y, **TOL)
    half = norm(epsilon=1e-3, dtype=jnp.bfloat16)
    got = half.apply(variables, jnp.asarray(x, jnp.bfloat16))
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(got, np.float32), y, rtol=2e-2, atol=2e-2)
    assert jax.tree.structure(half.apply(variables, x)) == jax.tree.structure(y)
