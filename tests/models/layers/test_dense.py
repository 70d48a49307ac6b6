"""models/layers/dense.py: logically named parameters, the Dense layer, and the FP8 state of the dense matmuls
(tests/models/test_fp8.py checks FP8's arithmetic)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models import layers
from tests.models.layers.references import TOL, boxed, init, perturbed, values


def test_dense_matches_numpy():
    module = layers.Dense(features=3, axes=("embed", "mlp"), init_std=0.4)
    x = np.random.default_rng(0).normal(size=(2, 5, 4)).astype(np.float32)
    variables = init(module, 0, x)
    params = boxed(variables)
    assert params["kernel"].names == ("embed", "mlp") and params["kernel"].value.shape == (4, 3)
    assert params["bias"].names == ("mlp",) and not params["bias"].value.any()
    p = values(perturbed(variables, 1))
    np.testing.assert_allclose(module.apply(perturbed(variables, 1), x), x @ p["kernel"] + p["bias"], **TOL)


class Fp8Dense(nn.Module):
    @nn.compact
    def __call__(self, x):
        kernel = layers.logical_param(self, "kernel", nn.initializers.normal(1.0), (4, 3), ("embed", "mlp"),
                                      jnp.float32)
        return layers.dense_einsum("fc", "bi,io->bo", x, kernel)


def test_fp8_state_variables():
    x = jnp.ones((2, 4))
    plain = init(Fp8Dense(), 0, x)
    assert layers.FP8_STATE not in plain
    variables = Fp8Dense().init(jax.random.PRNGKey(0), x, mutable=["params", layers.FP8_STATE])
    state = variables[layers.FP8_STATE]["fc_einsum"]
    expected = {f"{name}_{kind}" for name in ("input", "kernel", "output_grad") for kind in ("scale", "amax_history")}
    assert set(state) == expected
    for name, value in state.items():
        assert value.names == (None,) and value.value.dtype == jnp.float32
        if name.endswith("_scale"):
            np.testing.assert_array_equal(value.value, np.ones(1))
        else:
            np.testing.assert_array_equal(value.value, np.zeros(1024))
