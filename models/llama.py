"""Llama-class decoders in Flax Linen, as transformers' LlamaForCausalLM, MistralForCausalLM and
Qwen2ForCausalLM: RMSNorm before each branch, a SwiGLU MLP (silu(gate x) * fc x, then proj), rotary embeddings
on the whole head (Llama 3.1's frequency scaling with rope_scaling_factor), grouped-query attention, no biases
(Qwen2: on query, key and value), an output head untied from the input embedding (Qwen2's small sizes: tied),
and Mistral's causal sliding window. The blocks are the shared decoder's (models.layers.decoder).

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
from typing import ClassVar

from models import layers
from models.config import DecoderOnlyConfig


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
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0

    mlp_activation: ClassVar[str] = "silu"
    gated_mlp: ClassVar[bool] = True
    norm: ClassVar[str] = "rms"
    out_bias: ClassVar[bool] = False
    mlp_bias: ClassVar[bool] = False

    def __post_init__(self):
        super().__post_init__()
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window {self.sliding_window} must be a positive token count (or None).")
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
        return layers.Llama3Rotary(self.head_dim, self.rope_theta, self.rope_scaling_factor,
                                   self.rope_low_freq_factor, self.rope_high_freq_factor, self.rope_original_max_len)

    @property
    def input_init_std(self) -> float:
        return self.init_std

    @property
    def output_init_std(self) -> float:
        return self.init_std


class Llama(layers.DecoderOnly):
    """Token embeddings in (positions are rotary, in the blocks); an untied table out, or the input's: the
    shared decoder's own embeddings."""

    config: LlamaConfig
