"""layers.Einsum: the dense matmuls in the compute dtype, or in FP8 (flax's delayed scaling) when the model
carries FP8 state; every family gets that state from one switch (model_config.matmul_dtype)."""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models.bert import BertConfig
from models.gpt2 import GPT2Config
from models.neox import NeoXConfig
from models.t5 import T5Config
from partitioning import make_mesh
from t5x_like import lm as lm_lib
from t5x_like import optim
from t5x_like.errors import UserError
from t5x_like.experiment import ExperimentSettings, Restored, build_experiment, resolve_model_config

GPT2 = GPT2Config(vocab_size=256, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64, dtype="float32")
X = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 32))
KERNEL = 0.1 * jax.random.normal(jax.random.PRNGKey(1), (32, 4, 8))
EQUATION = "bte,ehd->bthd"


def einsum_variables(fp8: bool):
    collections = ["params", layers.FP8_STATE] if fp8 else ["params"]
    return layers.Einsum().init(jax.random.PRNGKey(0), EQUATION, X, KERNEL, mutable=collections)


def test_without_fp8_state_it_is_jnp_einsum():
    variables = einsum_variables(fp8=False)
    assert layers.FP8_STATE not in variables
    np.testing.assert_array_equal(layers.Einsum().apply(variables, EQUATION, X, KERNEL),
                                  jnp.einsum(EQUATION, X, KERNEL))


def test_with_fp8_state_it_quantises_and_its_gradient_is_the_next_state():
    state = nn.meta.unbox(einsum_variables(fp8=True)[layers.FP8_STATE])
    assert {k: v.shape for k, v in state.items()} == {
        "input_scale": (1,), "kernel_scale": (1,), "output_grad_scale": (1,),
        "input_amax_history": (1024,), "kernel_amax_history": (1024,), "output_grad_amax_history": (1024,)}
    cotangent = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 4, 8))

    def loss(x, kernel, fp8_state):
        y = layers.Einsum().apply({layers.FP8_STATE: fp8_state}, EQUATION, x, kernel)
        return (y * cotangent).sum(), y

    (_, _, new), y = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(X, KERNEL, state)
    exact = jnp.einsum(EQUATION, X, KERNEL)
    assert not np.array_equal(y, exact)  # quantised to e4m3 ...
    np.testing.assert_allclose(y, exact, atol=0.1 * float(jnp.abs(exact).max()))  # ... and still the product
    # The "gradient" of each history is the history with this step's amax in front; the scales come from the
    # old histories (all zeros: no amax seen yet, so they stay 1).
    assert float(new["input_amax_history"][0]) == pytest.approx(float(jnp.abs(X).max()))
    assert float(new["kernel_amax_history"][0]) == pytest.approx(float(jnp.abs(KERNEL).max()))
    assert float(new["output_grad_amax_history"][0]) == pytest.approx(float(jnp.abs(cotangent).max()))
    assert all(float(new[k][0]) == 1.0 for k in ("input_scale", "kernel_scale", "output_grad_scale"))
    # Fed back in, the next step's scales are amax / e4m3's largest value (448), as flax computes them.
    (_, _, after), _ = jax.grad(loss, argnums=(0, 1, 2), has_aux=True)(X, KERNEL, new)
    assert float(after["input_scale"][0]) == pytest.approx(float(jnp.abs(X).max()) / 448.0, rel=1e-6)


@pytest.mark.parametrize("config", [
    GPT2,
    NeoXConfig(vocab_size=256, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64),
    BertConfig(vocab_size=256, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64),
    T5Config(vocab_size=256, num_layers=2, num_decoder_layers=2, num_heads=4, embed_dim=32, d_kv=8, mlp_dim=64),
], ids=lambda c: c.family)
def test_every_family_gets_fp8_state_from_matmul_dtype(config):
    model = lm_lib.make_lm(config)
    lengths = {name: 8 for name in model.required_lengths()}
    plain = jax.eval_shape(lambda: model.init_variables(jax.random.PRNGKey(0), lengths))
    with_fp8 = jax.eval_shape(lambda: lm_lib.make_lm(dataclasses.replace(config, matmul_dtype="fp8")).init_variables(
        jax.random.PRNGKey(0), lengths))
    assert set(plain) == {"params"} and set(with_fp8) == {"params", layers.FP8_STATE}
    assert jax.tree.structure(plain["params"]) == jax.tree.structure(with_fp8["params"])
    histories = [x for p, x in jax.tree_util.tree_leaves_with_path(nn.meta.unbox(with_fp8[layers.FP8_STATE]))
                 if jax.tree_util.keystr(p).endswith("amax_history']")]
    assert histories  # the blocks' dense matmuls all carry state; parameter counts do not see it
    assert lm_lib.make_lm(dataclasses.replace(config, matmul_dtype="fp8")).num_params() == model.num_params()


def test_unknown_matmul_dtype_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"matmul_dtype 'int8' is unknown; choose None \(the compute dtype\) or 'fp8'"):
        dataclasses.replace(GPT2, matmul_dtype="int8")


def test_fp8_with_a_pipeline_is_refused():
    with pytest.raises(UserError, match="matmul_dtype='fp8' does not run pipelined"):
        build_experiment(ExperimentSettings(
            model=dataclasses.replace(GPT2, matmul_dtype="fp8"), mesh=make_mesh(data=1, stage=2, devices=jax.devices()[:2]),
            rules="fsdp_tensor", optimizer=optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=1), batch_size=8,
            feature_lengths={"targets": 16}, pipeline_microbatches=2), train_steps=2)


def test_resuming_with_another_matmul_dtype_is_refused_and_restore_from_takes_the_runs():
    plain, with_fp8 = GPT2, dataclasses.replace(GPT2, matmul_dtype="fp8")
    for run, checkpoint in ((with_fp8, plain), (plain, with_fp8)):
        for adopt_architecture in (False, True):  # a resume, of a RESTORE_FROM run too
            with pytest.raises(UserError, match="the FP8 state does not carry over a resume"):
                resolve_model_config(run, 1, Restored(checkpoint, resuming=True, adopt_architecture=adopt_architecture))
    assert resolve_model_config(with_fp8, 1, Restored(plain, adopt_architecture=True)).matmul_dtype == "fp8"
