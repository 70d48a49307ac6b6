"""Llama-class decoders in Flax Linen, as transformers' LlamaForCausalLM, MistralForCausalLM and
Qwen2ForCausalLM: pre-norm blocks with a sequential residual, h = x + attn(ln_1 x), then h + mlp(ln_2 h),
RMSNorm, a SwiGLU MLP (proj(silu(gate x) * fc x)), rotary embeddings on the whole head (Llama 3.1's
frequency scaling with rope_scaling_factor), grouped-query attention, no biases (Qwen2: on query, key and
value), an output head untied from the input embedding (Qwen2's small sizes: tied), and Mistral's causal
sliding window. The stack, final norm and output head are the shared decoder's (models.layers.decoder).

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    embed_in/embedding [padded_vocab, embed]   embed_out/embedding [padded_vocab, embed] (untied only)
    blocks/{ln_1/scale, attn/{query,key,value,out}_kernel (+ {query,key,value}_bias), ln_2/scale,
            mlp/{gate,fc,proj}_kernel}
    ln_f/scale

Every weight starts at normal(init_std), transformers' initializer_range.
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models.config import DecoderOnlyConfig
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class Llama3Rotary(layers.Rotary):
    """Rotary embeddings with Llama 3.1's frequency scaling (transformers' rope_type 'llama3'): pairs whose
    wavelength exceeds original_max_len / low_freq_factor turn `factor` times slower, those below
    original_max_len / high_freq_factor keep their frequency, and the ones between blend the two."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    def inverse_frequencies(self) -> jax.Array:
        frequencies = super().inverse_frequencies()
        wavelengths = 2 * math.pi / frequencies
        low_wavelength = self.original_max_len / self.low_freq_factor
        high_wavelength = self.original_max_len / self.high_freq_factor
        smooth = (self.original_max_len / wavelengths - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * frequencies / self.factor + smooth * frequencies
        scaled = jnp.where(wavelengths > low_wavelength, frequencies / self.factor, frequencies)
        return jnp.where((wavelengths >= high_wavelength) & (wavelengths <= low_wavelength), blended, scaled)


@dataclasses.dataclass(frozen=True)
class LlamaConfig(DecoderOnlyConfig):
    """Hyper-parameters of one Llama-class decoder (sizes and run choices are DecoderOnlyConfig's; the
    presets, configs/llama.py, give the published ones); plain values only, so it round-trips through JSON."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = DecoderOnlyConfig.POSITIVE_FIELDS + (
        "num_key_value_heads", "rope_theta", "rope_scaling_factor", "rope_original_max_len")

    family: str = "llama"
    vocab_size: int = 32000
    max_len: int = 4096
    num_key_value_heads: int | None = None
    """Grouped-query attention's key/value heads (None: one per query head)."""
    rope_theta: float = 10000.0
    rope_scaling_factor: float | None = None
    """Llama 3.1's rotary scaling (transformers' rope_type 'llama3') with the three fields below; None: none."""
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    sliding_window: int | None = None
    """Mistral: each token attends to itself and the sliding_window - 1 tokens before it."""
    qkv_bias: bool = False
    """Qwen2: biases on the query, key and value projections."""
    tie_word_embeddings: bool = False
    """Qwen2's small sizes: the output head is the input embedding."""
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window {self.sliding_window} must be a positive token count (or None).")
        if self.qkv_bias and self.sliding_window:
            raise ValueError(f"qkv_bias with sliding_window {self.sliding_window}: no Llama-class model has both "
                             "(Mistral has the window, Qwen2 the biases); choose one.")
        if self.rope_scaling_factor is not None and not (
                self.rope_scaling_factor >= 1 and self.rope_high_freq_factor > self.rope_low_freq_factor > 0):
            raise ValueError(f"rope scaling factor {self.rope_scaling_factor}, low/high frequency factors "
                             f"{self.rope_low_freq_factor}/{self.rope_high_freq_factor}: need factor >= 1 and "
                             "high > low > 0 (Llama 3.1: 8, 1, 4).")

    @property
    def num_kv_heads(self) -> int:
        return self.num_key_value_heads or self.num_heads

    @property
    def rotary(self) -> layers.Rotary:
        if self.rope_scaling_factor is None:
            return layers.Rotary(self.head_dim, self.rope_theta)
        return Llama3Rotary(self.head_dim, self.rope_theta, self.rope_scaling_factor,
                                   self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_max_len)

    @property
    def input_init_std(self) -> float:
        return self.init_std

    def mlp_params(self) -> int:
        """gate, fc and proj (SwiGLU)."""
        return 3 * self.embed_dim * self.mlp_dim

    def attention_pairs(self, length: int) -> float:
        """With a sliding window W < T: T·W - W(W-1)/2 pairs (each token sees at most W)."""
        w = self.sliding_window
        if w is None or w >= length:
            return super().attention_pairs(length)
        return length * w - w * (w - 1) / 2

    def block_notes(self) -> str:
        return f", sliding window {self.sliding_window}" if self.sliding_window else ""


def norm(c: LlamaConfig, name: str) -> layers.RMSNorm:
    return layers.RMSNorm(c.layer_norm_eps, dtype=c.compute_dtype, name=name)


class LlamaBlock(layers.DecoderBlock):
    """h = x + attn(ln_1 x), then h + mlp(ln_2 h); dropout on both branches. Rotary grouped-query attention
    (num_kv_heads key/value heads; Mistral: a sliding window; Qwen2: biases on query, key and value), the
    gated MLP proj(silu(gate x) * fc x), no other biases. A family with another attention or feed-forward
    (Qwen3's normed queries and keys, a mixture of experts) overrides `attention` or `feed_forward`."""

    config: LlamaConfig

    def attention(self, **options) -> layers.Attention:
        """The block's attention, `attn`; `options` are more of layers.Attention's (Qwen3: qk_norm_eps)."""
        c = self.config
        return layers.Attention(c.num_heads, c.head_dim, c.init_std, c.init_std, num_kv_heads=c.num_kv_heads,
                                qkv_bias=c.qkv_bias, rotary=c.rotary, window=c.sliding_window, attention=c.attention,
                                dropout_rate=c.attention_dropout_rate, dtype=c.compute_dtype, name="attn", **options)

    def feed_forward(self, h: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
        """The block's MLP on the normed residual stream h (segment_ids: 0 marks padding)."""
        c = self.config
        return layers.MLP(c.mlp_dim, "silu", c.init_std, c.init_std, gated=True, dtype=c.compute_dtype, name="mlp")(h)

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array):
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        h = x + dropout(self.attention()(norm(c, "ln_1")(x), deterministic=self.deterministic,
                                         segment_ids=segment_ids, positions=positions))
        h = h + dropout(self.feed_forward(norm(c, "ln_2")(h), segment_ids))
        return nn.with_logical_constraint(h, layers.BATCH_LENGTH_EMBED), None


class Llama(layers.DecoderOnly):
    """Token embeddings in (positions are rotary, in the blocks), LlamaBlocks, RMSNorm; an untied table out,
    or, with tie_word_embeddings, the input's."""

    config: LlamaConfig
    block = LlamaBlock
    final_norm = layers.RMSNorm

    def setup(self):
        self.embed_in = self.token_table()
        if not self.config.tie_word_embeddings:
            self.embed_out = self.token_table()

    def output_table(self) -> jax.Array:
        return (self.embed_in if self.config.tie_word_embeddings else self.embed_out).embedding


FAMILIES = {"llama": Family(LlamaConfig, Llama, "decoder_only")}
