"""The transformer MLP of every family: proj(act(fc x)), or gated proj(act(gate x) * fc x)."""
from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from models.layers.dense import BATCH_LENGTH_EMBED, BATCH_LENGTH_MLP, add_bias, dense_einsum, normal_param

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu,  # T5 v1.0
    "gelu": functools.partial(jax.nn.gelu, approximate=False),  # exact (erf): GPT-NeoX, BERT
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),  # GPT-2, T5 v1.1 (gated)
    "silu": jax.nn.silu,  # Llama (gated: SwiGLU)
}
"""MLP activations by name."""


class MLP(nn.Module):
    """fc (embed -> mlp), the activation, dropout on the hidden units, proj (mlp -> embed); gated, the
    activation of a second projection `gate` multiplies fc's output. Kernels fc/gate [embed, mlp] and
    proj [mlp, embed] (normal(init_std), proj normal(out_init_std)); with `use_bias`, fc_bias (gate_bias)
    [mlp] and proj_bias [embed] (zeros)."""

    mlp_dim: int
    activation: str
    init_std: float
    out_init_std: float
    gated: bool = False
    use_bias: bool = False
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def projection(self, name: str, x: jax.Array) -> jax.Array:
        kernel = normal_param(self, f"{name}_kernel", self.init_std, (x.shape[-1], self.mlp_dim), ("embed", "mlp"),
                              self.param_dtype)
        y = dense_einsum(name, "bte,em->btm", x, kernel.astype(self.dtype))
        y = add_bias(self, y, f"{name}_bias", (self.mlp_dim,), ("mlp",), self.use_bias)
        return nn.with_logical_constraint(y, BATCH_LENGTH_MLP)

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        activation = ACTIVATIONS[self.activation]
        h = self.projection("fc", x)
        h = activation(self.projection("gate", x)) * h if self.gated else activation(h)
        h = checkpoint_name(h, "mlp_hidden")
        h = nn.Dropout(self.dropout_rate, deterministic=deterministic)(h)
        embed = x.shape[-1]
        proj = normal_param(self, "proj_kernel", self.out_init_std, (self.mlp_dim, embed), ("mlp", "embed"),
                            self.param_dtype)
        out = dense_einsum("proj", "btm,me->bte", h, proj.astype(self.dtype))
        out = add_bias(self, out, "proj_bias", (embed,), ("embed",), self.use_bias)
        return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)
