"""Normalisation over the last axis, statistics in fp32: LayerNorm (GPT-2, GPT-NeoX, BERT) and RMSNorm
(T5, Llama), with 'embed'-named parameters (or another logical axis: Qwen3's norms over a head are 'kv')."""
from __future__ import annotations

from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers.dense import logical_param, zeros_param


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) * scale: no mean subtracted, no bias (T5's layer norm)."""

    epsilon: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    axis: str = "embed"
    """The logical axis of the normalised features (and of the parameters)."""
    centered: ClassVar[bool] = False
    """Subtract the mean first and add a bias after (LayerNorm)."""

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = (x.shape[-1],)
        scale = logical_param(self, "scale", nn.initializers.ones, features, (self.axis,), self.param_dtype)
        x = x.astype(jnp.float32)
        if self.centered:
            x = x - x.mean(-1, keepdims=True)
        y = x * jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + self.epsilon) * scale
        if self.centered:
            y = y + zeros_param(self, "bias", features, (self.axis,), self.param_dtype)
        return y.astype(self.dtype)


class LayerNorm(RMSNorm):
    """(x - mean) / sqrt(var + eps) * scale + bias."""

    centered: ClassVar[bool] = True
