"""GPT-2 (Radford et al. 2019) in Flax Linen, and CPM-1 (a GPT-2 with its own vocabulary): learned
positions, pre-LN blocks, GELU(tanh) MLP, biases everywhere, tied input/output embeddings, dropout on
embeddings, attention and residual branches. The blocks are the shared decoder's (models.layers.decoder).

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    wte/embedding [padded_vocab, embed]   wpe/embedding [max_len, embed]
    blocks/{ln_1, attn/{query,key,value,out}_{kernel,bias}, ln_2, mlp/{fc,proj}_{kernel,bias}}
    ln_f/{scale, bias}
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax

from models import layers
from models.config import DecoderOnlyConfig


@dataclasses.dataclass(frozen=True)
class GPT2Config(DecoderOnlyConfig):
    """Hyper-parameters of one GPT-2 (the sizes and run choices are DecoderOnlyConfig's, with GPT-2
    small's defaults); plain values only, so it round-trips through JSON."""

    family: str = "gpt2"
    vocab_size: int = 50257
    init_std: float = 0.02

    mlp_activation: ClassVar[str] = "gelu_tanh"

    @property
    def input_init_std(self) -> float:
        return self.init_std

    @property
    def output_init_std(self) -> float:
        """GPT-2's residual-projection init: init_std / sqrt(2 * num_layers)."""
        return self.init_std / math.sqrt(2 * self.num_layers)


class GPT2(layers.DecoderOnly):
    """Token plus learned position embeddings in; the token table, tied, out."""

    config: GPT2Config

    def setup(self):
        c = self.config
        self.wte = layers.Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.init_std, dtype=c.compute_dtype)
        self.wpe = layers.Embed(c.max_len, c.embed_dim, ("position", "embed"), c.init_std, dtype=c.compute_dtype)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        return self.wte(tokens) + self.wpe(positions)

    def output_table(self) -> jax.Array:
        return self.wte.embedding
