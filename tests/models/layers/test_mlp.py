"""models/layers/mlp.py: the MLP of every family (GPT-2's biased GELU(tanh), T5's unbiased ReLU and gated
GELU, Llama's gated SiLU) against numpy: parameters, initialisers, forward, dtypes and dropout."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from tests.models.layers.references import TOL, boxed, gelu_tanh, init, perturbed, values

ACTIVATIONS = {"relu": lambda x: np.maximum(x, 0), "gelu_tanh": gelu_tanh, "silu": lambda x: x / (1 + np.exp(-x)),
               "gelu": lambda x: 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))}


@pytest.mark.parametrize("activation, gated, use_bias", [("relu", False, False), ("gelu_tanh", True, False),
                                                         ("gelu_tanh", False, True), ("gelu", False, True),
                                                         ("silu", True, False)])
def test_mlp_matches_numpy(activation, gated, use_bias):
    module = layers.MLP(mlp_dim=7, activation=activation, init_std=0.5, out_init_std=0.3, gated=gated,
                        use_bias=use_bias)
    x = np.random.default_rng(14).normal(size=(2, 3, 5)).astype(np.float32)
    variables = init(module, 15, x)
    params = boxed(variables)
    kernels = ["fc_kernel", "proj_kernel"] + (["gate_kernel"] if gated else [])
    biases = (["fc_bias", "proj_bias"] + (["gate_bias"] if gated else [])) if use_bias else []
    assert sorted(params) == sorted(kernels + biases)
    assert params["fc_kernel"].names == ("embed", "mlp") and params["proj_kernel"].names == ("mlp", "embed")
    if use_bias:
        assert params["fc_bias"].names == ("mlp",) and params["proj_bias"].names == ("embed",)
        assert not params["fc_bias"].value.any() and not params["proj_bias"].value.any()
    variables = perturbed(variables, 16)
    p = values(variables)
    act = ACTIVATIONS[activation]
    h = x @ p["fc_kernel"] + p.get("fc_bias", 0.0)
    h = act(x @ p["gate_kernel"] + p.get("gate_bias", 0.0)) * h if gated else act(h)
    np.testing.assert_allclose(module.apply(variables, x), h @ p["proj_kernel"] + p.get("proj_bias", 0.0), **TOL)


def test_mlp_initialisers_dtypes_and_dropout():
    wide = layers.MLP(mlp_dim=256, activation="relu", init_std=0.5, out_init_std=0.1, gated=True, dropout_rate=0.5,
                      dtype=jnp.bfloat16)
    variables = init(wide, 0, np.zeros((1, 1, 128), np.float32))
    for name, std in (("fc_kernel", 0.5), ("gate_kernel", 0.5), ("proj_kernel", 0.1)):
        assert np.std(variables["params"][name].value) == pytest.approx(std, rel=0.05)
        assert variables["params"][name].value.dtype == jnp.float32
    x = jnp.ones((1, 2, 128), jnp.bfloat16)
    assert wide.apply(variables, x).dtype == jnp.bfloat16
    kept = wide.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.PRNGKey(1)})
    np.testing.assert_array_equal(wide.apply(variables, x, deterministic=True), wide.apply(variables, x))
    assert not np.allclose(np.asarray(kept, np.float32), np.asarray(wide.apply(variables, x), np.float32), atol=1e-2)
