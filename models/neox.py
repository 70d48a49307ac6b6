"""GPT-NeoX (Black et al. 2022; Pythia, NeoX-20B) in Flax Linen, as transformers' GPTNeoXForCausalLM:
rotary position embeddings on the first `rotary_pct` of each head's dims, pre-LN blocks with a
parallel residual x + attn(ln_1 x) + mlp(ln_2 x) (use_parallel_residual=False: GPT-2's sequential
h = x + attn(ln_1 x), then h + mlp(ln_2 h)), exact GELU, biases everywhere, and an output head untied
from the input embedding. The embeddings, stack, final norm and output head are the shared decoder's
(models.layers.decoder).

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    embed_in/embedding [padded_vocab, embed]   embed_out/embedding [padded_vocab, embed]
    blocks/{ln_1/{scale, bias}, attn/{query,key,value,out}_{kernel,bias}, ln_2/{scale, bias},
            mlp/{fc,proj}_{kernel,bias}}
    ln_f/{scale, bias}

Initialisation follows GPT-NeoX's own trainer (Pythia and NeoX-20B configs): "small_init",
normal(sqrt(2 / (5 * embed))), for the embeddings, the input projections and the output head, and
"wang_init", normal(2 / (num_layers * sqrt(embed))), for the two projections back into the residual
stream. `init_std` overrides the small_init value (transformers initialises everything at 0.02).
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import flax.linen as nn
import jax

from models import layers
from models.config import DecoderOnlyConfig
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class NeoXConfig(DecoderOnlyConfig):
    """Hyper-parameters of one GPT-NeoX (the sizes and run choices are DecoderOnlyConfig's); plain
    values only, so it round-trips through JSON."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = DecoderOnlyConfig.POSITIVE_FIELDS + ("rotary_base",)

    family: str = "neox"
    vocab_size: int = 50277
    max_len: int = 2048
    rotary_pct: float = 0.25
    rotary_base: float = 10000.0
    use_parallel_residual: bool = True
    """x + attn(ln_1 x) + mlp(ln_2 x); False: the sequential h = x + attn(ln_1 x), then h + mlp(ln_2 h)."""
    init_std: float | None = None
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if not 0.0 < self.rotary_pct <= 1.0 or self.rotary_dim == 0 or self.rotary_dim % 2:
            raise ValueError(
                f"rotary_pct {self.rotary_pct} gives {self.rotary_dim} rotary dims of a {self.head_dim}-dim head; "
                "choose a fraction in (0, 1] that gives an even, nonzero count."
            )

    @property
    def rotary_dim(self) -> int:
        """Rotated dims per head, as GPT-NeoX and transformers count them: int(head_dim * rotary_pct)."""
        return int(self.head_dim * self.rotary_pct)

    @property
    def rotary(self) -> layers.Rotary:
        return layers.Rotary(self.rotary_dim, self.rotary_base)

    @property
    def input_init_std(self) -> float:
        """init_std, or GPT-NeoX's small_init sqrt(2 / (5 * embed)) when it is None."""
        return self.init_std if self.init_std is not None else math.sqrt(2.0 / (5.0 * self.embed_dim))

    @property
    def output_init_std(self) -> float:
        """GPT-NeoX's wang_init for projections into the residual stream: 2 / (layers * sqrt(embed))."""
        return 2.0 / (self.num_layers * math.sqrt(self.embed_dim))

    def block_notes(self) -> str:
        return ", parallel residual" if self.use_parallel_residual else ""


def norm(c: NeoXConfig, name: str) -> layers.LayerNorm:
    return layers.LayerNorm(c.layer_norm_eps, dtype=c.compute_dtype, name=name)


class NeoXBlock(layers.DecoderBlock):
    """x + attn(ln_1 x) + mlp(ln_2 x), or with use_parallel_residual=False h = x + attn(ln_1 x), then
    h + mlp(ln_2 h); dropout on both branches. Attention with rotary embeddings and biases on query, key,
    value and output; the MLP fc, exact GELU, proj with biases."""

    config: NeoXConfig

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array):
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        attn = layers.Attention(c.num_heads, c.head_dim, c.input_init_std, c.output_init_std, qkv_bias=True,
                                out_bias=True, rotary=c.rotary, attention=c.attention,
                                dropout_rate=c.attention_dropout_rate, dtype=c.compute_dtype, name="attn")
        mlp = layers.MLP(c.mlp_dim, "gelu", c.input_init_std, c.output_init_std, use_bias=True,
                         dtype=c.compute_dtype, name="mlp")
        attended = x + dropout(attn(norm(c, "ln_1")(x), deterministic=self.deterministic,
                                    segment_ids=segment_ids, positions=positions))
        mlp_input = x if c.use_parallel_residual else attended  # parallel: both branches read the block's input
        h = attended + dropout(mlp(norm(c, "ln_2")(mlp_input)))
        return nn.with_logical_constraint(h, layers.BATCH_LENGTH_EMBED), None


class NeoX(layers.DecoderOnly):
    """Token embeddings in (positions are rotary, in the blocks), NeoXBlocks, LayerNorm; an untied table
    out: the shared decoder's own embeddings."""

    config: NeoXConfig
    block = NeoXBlock
    final_norm = layers.LayerNorm


FAMILIES = {"neox": Family(NeoXConfig, NeoX, "decoder_only")}
