"""GPT-2 (Radford et al. 2019) in Flax Linen, and CPM-1 (a GPT-2 with its own vocabulary): learned
positions, pre-LN blocks with a sequential residual, h = x + attn(ln_1 x), then h + mlp(ln_2 h), a GELU(tanh)
MLP, biases everywhere, tied input/output embeddings, dropout on embeddings, attention and residual
branches. The stack, final norm and output head are the shared decoder's (models.layers.decoder).

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    wte/embedding [padded_vocab, embed]   wpe/embedding [max_len, embed]
    blocks/{ln_1/{scale, bias}, attn/{query,key,value,out}_{kernel,bias}, ln_2/{scale, bias},
            mlp/{fc,proj}_{kernel,bias}}
    ln_f/{scale, bias}
"""
from __future__ import annotations

import dataclasses
import math

import flax.linen as nn
import jax

from models import layers
from models.config import DecoderOnlyConfig
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class GPT2Config(DecoderOnlyConfig):
    """Hyper-parameters of one GPT-2 (the sizes and run choices are DecoderOnlyConfig's, with GPT-2
    small's defaults); plain values only, so it round-trips through JSON."""

    family: str = "gpt2"
    vocab_size: int = 50257
    init_std: float = 0.02

    @property
    def input_init_std(self) -> float:
        return self.init_std

    @property
    def output_init_std(self) -> float:
        """GPT-2's residual-projection init: init_std / sqrt(2 * num_layers)."""
        return self.init_std / math.sqrt(2 * self.num_layers)


def norm(c: GPT2Config, name: str) -> layers.LayerNorm:
    return layers.LayerNorm(c.layer_norm_eps, dtype=c.compute_dtype, name=name)


class GPT2Block(layers.DecoderBlock):
    """h = x + attn(ln_1 x), then h + mlp(ln_2 h); dropout on both branches. Multi-head attention with
    biases on query, key, value and output (positions are the learned table's, not the attention's);
    the MLP fc, GELU(tanh), proj with biases."""

    config: GPT2Config

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array):
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        attn = layers.Attention(c.num_heads, c.head_dim, c.input_init_std, c.output_init_std, qkv_bias=True,
                                out_bias=True, attention=c.attention, dropout_rate=c.attention_dropout_rate,
                                dtype=c.compute_dtype, name="attn")
        mlp = layers.MLP(c.mlp_dim, "gelu_tanh", c.input_init_std, c.output_init_std, use_bias=True,
                         dtype=c.compute_dtype, name="mlp")
        h = x + dropout(attn(norm(c, "ln_1")(x), deterministic=self.deterministic, segment_ids=segment_ids))
        h = h + dropout(mlp(norm(c, "ln_2")(h)))
        return nn.with_logical_constraint(h, layers.BATCH_LENGTH_EMBED), None


class GPT2(layers.DecoderOnly):
    """Token plus learned position embeddings in, GPT2Blocks, LayerNorm; the token table, tied, out."""

    config: GPT2Config
    block = GPT2Block
    final_norm = layers.LayerNorm

    def setup(self):
        c = self.config
        self.wte = layers.Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.init_std, dtype=c.compute_dtype)
        self.wpe = layers.Embed(c.max_len, c.embed_dim, ("position", "embed"), c.init_std, dtype=c.compute_dtype)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        return self.wte(tokens) + self.wpe(positions)

    def output_table(self) -> jax.Array:
        return self.wte.embedding


FAMILIES = {"gpt2": Family(GPT2Config, GPT2, "decoder_only")}
