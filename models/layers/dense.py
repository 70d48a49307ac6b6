"""What every layer builds on: parameters with logical axis names, the activations' axis names, and the
dense matmul (in the compute dtype, or in FP8 with delayed scaling).

Every parameter is created through `nn.with_logical_partitioning` and every einsum names its dimensions,
so that a mesh plus rules (see partitioning/) decide the layout. Kernels are stored in `param_dtype` and
cast to the compute `dtype` at use. (Linen's DenseGeneral with multi-dimensional logically partitioned
kernels breaks under a mesh with rules: the layers create their kernels here and call einsum.)
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

Initializer = Callable[..., jax.Array]

BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
BATCH_LENGTH_HEADS_KV = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
BATCH_LENGTH_MLP = ("activation_batch", "activation_length", "activation_mlp")
BATCH_LENGTH_VOCAB = ("activation_batch", "activation_length", "activation_vocab")
CACHE_BATCH_LENGTH = ("activation_batch", "activation_length")


def logical_param(module: nn.Module, name: str, init: Initializer, shape: Sequence[int],
                  axes: Sequence[str | None], dtype) -> jax.Array:
    """A parameter carrying logical axis names (one per dimension)."""
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype)


def normal_param(module: nn.Module, name: str, std: float, shape: Sequence[int], axes: Sequence[str | None],
                 dtype) -> jax.Array:
    """A kernel drawn from normal(std), named by `axes`."""
    return logical_param(module, name, nn.initializers.normal(std), shape, axes, dtype)


def zeros_param(module: nn.Module, name: str, shape: Sequence[int], axes: Sequence[str | None], dtype) -> jax.Array:
    """A bias starting at zero, named by `axes`."""
    return logical_param(module, name, nn.initializers.zeros, shape, axes, dtype)


FP8_STATE = fp8_ops.OVERWRITE_WITH_GRADIENT
"""The variable collection holding the FP8 matmuls' scales and amax histories (flax's name): not
parameters but state, whose "gradient" is its next value (the trainer overwrites it, no optimizer)."""


class Einsum(nn.Module):
    """`jnp.einsum(equation, x, kernel)` of a dense layer (x activations, kernel the weight in the compute
    dtype), or the same in FP8 with delayed scaling through flax's FP8 ops (as its Fp8Einsum, which
    XLA's GPU compiler rewrites into cuBLASLt FP8 GEMMs): operands quantised to e4m3 and the output's
    gradient to e5m2, each with a scale from the amax history of earlier steps.

    FP8 runs when the module has its state: created at init when the FP8_STATE collection is mutable
    (LanguageModel.init asks for it when model_config.matmul_dtype == 'fp8'), used whenever applied
    with it. Applied without it (eval, generate, converters: parameters only) the matmul runs in the
    compute dtype. The state's variables are flax's Fp8Einsum's, scalars and histories replicated."""

    amax_history_length: int = 1024

    def fp8_state(self, name: str, init: Callable[[tuple[int, ...]], jax.Array], length: int) -> jax.Array:
        boxed = nn.with_logical_partitioning(lambda: init((length,), jnp.float32), (None,))
        return self.variable(FP8_STATE, name, boxed).value

    @nn.compact
    def __call__(self, equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
        fp8 = (self.is_mutable_collection(FP8_STATE) if self.is_initializing()
               else self.has_variable(FP8_STATE, "input_scale"))
        if not fp8:
            return jnp.einsum(equation, x, kernel)
        state = {f"{arg}_scale": self.fp8_state(f"{name}_scale", jnp.ones, 1)
                 for arg, name in (("lhs", "input"), ("rhs", "kernel"), ("grad", "output_grad"))}
        state.update({f"{arg}_amax_history": self.fp8_state(f"{name}_amax_history", jnp.zeros,
                                                            self.amax_history_length)
                      for arg, name in (("lhs", "input"), ("rhs", "kernel"), ("grad", "output_grad"))})
        dot_general = functools.partial(fp8_ops.fp8_scaled_dot_general, quantize_compute_type=kernel.dtype, **state)
        return jnp.einsum(equation, x.astype(kernel.dtype), kernel, _dot_general=dot_general)


def dense_einsum(name: str, equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
    """A dense layer's matmul through `Einsum` (FP8 when the model has FP8 state), named `<name>_einsum`."""
    return Einsum(name=f"{name}_einsum")(equation, x, kernel)


def add_bias(module: nn.Module, y: jax.Array, name: str, shape: Sequence[int], axes: Sequence[str | None],
             use_bias: bool) -> jax.Array:
    """y plus the parameter `name` (zeros at init, cast to the module's compute dtype) when use_bias, else y."""
    if not use_bias:
        return y
    return y + zeros_param(module, name, shape, axes, module.param_dtype).astype(module.dtype)


class Dense(nn.Module):
    """x @ kernel + bias over the last axis: kernel [in, features] and bias [features] named by `axes`
    (input, output) and initialised normal(init_std) / zeros (BERT's pooler and MLM transform)."""

    features: int
    axes: tuple[str | None, str | None]
    init_std: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = normal_param(self, "kernel", self.init_std, (x.shape[-1], self.features), self.axes,
                              self.param_dtype)
        y = dense_einsum("kernel", "...i,io->...o", x.astype(self.dtype), kernel.astype(self.dtype))
        return add_bias(self, y, "bias", (self.features,), self.axes[1:], True)
