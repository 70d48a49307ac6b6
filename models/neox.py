"""GPT-NeoX (Black et al. 2022; Pythia, NeoX-20B) in Flax Linen, as transformers' GPTNeoXForCausalLM:
rotary position embeddings on the first `rotary_pct` of each head's dims, pre-LN blocks with a
parallel residual x + attn(ln_1 x) + mlp(ln_2 x) (or GPT-2's sequential one), exact GELU, biases
everywhere, and an output head untied from the input embedding.

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    embed_in/embedding [padded_vocab, embed]   embed_out/embedding [padded_vocab, embed]
    blocks/{ln_1, attn/{query,key,value,out}_{kernel,bias}, ln_2, mlp/{fc,proj}_{kernel,bias}}
    ln_f/{scale, bias}

Initialisation follows GPT-NeoX's own trainer (Pythia and NeoX-20B configs): "small_init",
normal(sqrt(2 / (5 * embed))), for the embeddings, the input projections and the output head, and
"wang_init", normal(2 / (num_layers * sqrt(embed))), for the two projections back into the residual
stream. `init_std` overrides the small_init value (transformers initialises everything at 0.02).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models.config import DecoderOnlyConfig, FamilyConfig


@dataclasses.dataclass(frozen=True)
class NeoXConfig(DecoderOnlyConfig):
    """Hyper-parameters of one GPT-NeoX; plain values only, so it round-trips through JSON."""

    RUN_FIELDS: ClassVar[tuple[str, ...]] = FamilyConfig.RUN_FIELDS + ("dropout_rate", "attention_dropout_rate")

    vocab_size: int = 50277
    max_len: int = 2048
    num_layers: int = 12
    num_heads: int = 12
    embed_dim: int = 768
    mlp_dim: int = 3072
    rotary_pct: float = 0.25
    rotary_base: float = 10000.0
    use_parallel_residual: bool = True
    layer_norm_eps: float = 1e-5
    init_std: float | None = None
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0
    vocab_pad_multiple: int = 128
    scan_layers: bool = True
    remat_policy: str = "none"
    attention: str = "auto"
    dtype: str = "float32"
    family: str = "neox"

    def __post_init__(self):
        self.check_common()
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}; "
                "choose a head count that divides the width."
            )
        if not 0.0 < self.rotary_pct <= 1.0 or self.rotary_dim == 0 or self.rotary_dim % 2:
            raise ValueError(
                f"rotary_pct {self.rotary_pct} gives {self.rotary_dim} rotary dims of a {self.head_dim}-dim head; "
                "choose a fraction in (0, 1] that gives an even, nonzero count."
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def rotary_dim(self) -> int:
        """Rotated dims per head, as GPT-NeoX and transformers count them: int(head_dim * rotary_pct)."""
        return int(self.head_dim * self.rotary_pct)

    @property
    def input_init_std(self) -> float:
        """init_std, or GPT-NeoX's small_init sqrt(2 / (5 * embed)) when it is None."""
        return self.init_std if self.init_std is not None else math.sqrt(2.0 / (5.0 * self.embed_dim))

    @property
    def output_init_std(self) -> float:
        """GPT-NeoX's wang_init for projections into the residual stream: 2 / (layers * sqrt(embed))."""
        return 2.0 / (self.num_layers * math.sqrt(self.embed_dim))

    def matmul_params(self) -> int:
        """Weights each token multiplies with: the blocks and the output head, not the input lookup."""
        e, m = self.embed_dim, self.mlp_dim
        block = 4 * e * e + 2 * e * m
        return self.num_layers * block + self.vocab_size * e

    def summary(self) -> str:
        residual = "parallel" if self.use_parallel_residual else "sequential"
        return (f"neox: {self.num_layers} layers, width {self.embed_dim}, {self.num_heads} heads x "
                f"{self.head_dim} (rotary on {self.rotary_dim}), mlp {self.mlp_dim}, {residual} residual, "
                f"vocab {self.vocab_size} (padded to {self.padded_vocab_size}), max_len {self.max_len}, "
                f"{self.dtype}")


class Block(nn.Module):
    """Parallel residual: x + attn(ln_1 x) + mlp(ln_2 x); sequential: h = x + attn(ln_1 x),
    then h + mlp(ln_2 h). Dropout on both branches."""

    config: NeoXConfig
    deterministic: bool

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array):
        c = self.config
        dtype = c.compute_dtype
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        attention = layers.SelfAttention(
            c.num_heads, c.head_dim, c.input_init_std, c.output_init_std, c.attention, c.attention_dropout_rate,
            dtype=dtype, rotary_dim=c.rotary_dim, rotary_base=c.rotary_base, name="attn")
        mlp = layers.MLP(c.mlp_dim, c.input_init_std, c.output_init_std, dtype=dtype, approximate_gelu=False,
                         name="mlp")
        ln_1 = layers.LayerNorm(c.layer_norm_eps, dtype=dtype, name="ln_1")
        ln_2 = layers.LayerNorm(c.layer_norm_eps, dtype=dtype, name="ln_2")
        attended = x + dropout(attention(ln_1(x), segment_ids, self.deterministic, positions))
        mlp_input = x if c.use_parallel_residual else attended
        x = attended + dropout(mlp(ln_2(mlp_input)))
        return nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED), None


class NeoX(nn.Module):
    """Decoder-only language model. `__call__` returns fp32 logits over the padded vocabulary,
    with padding ids masked so they never take probability mass."""

    config: NeoXConfig
    layer_stack: Callable[[type[nn.Module], type[nn.Module]], Callable[..., nn.Module]] | None = None
    """Injected by the runtime to replace the scanned stack (e.g. by a pipeline): called with the
    block class and the nn.scan stack class, returns a constructor called like the stack class."""

    def setup(self):
        c = self.config
        dtype = c.compute_dtype
        self.embed_in = layers.Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.input_init_std,
                                     dtype=dtype)
        self.embed_out = layers.LMHead(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.input_init_std,
                                       dtype=dtype)
        self.ln_f = layers.LayerNorm(c.layer_norm_eps, dtype=dtype)

    def stack(self, deterministic: bool) -> Callable:
        c = self.config
        return layers.block_stack(layers.remat(Block, c.remat_policy), (c, deterministic), num_layers=c.num_layers,
                                  scan_layers=c.scan_layers, broadcast_args=2, layer_stack=self.layer_stack)

    @nn.compact
    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, deterministic: bool = True,
                 return_hidden: bool = False):
        """tokens [batch, length] -> logits [batch, length, padded_vocab] (fp32).

        positions (the rotary angles) default to 0..length-1; packed rows pass per-document
        positions and segment_ids (0 = padding). With return_hidden, returns (final hidden states,
        the output head's table [padded_vocab, embed]) instead, for a loss that never materialises
        the logits.

        KV-cache decoding: apply with mutable=['cache']. The first such call creates a cache as
        long as its input (e.g. zeros [batch, prompt + new tokens]); each later call appends its
        tokens at the cache index. Decoding passes positions (rows may be left-padded) and
        segment_ids marking padding with 0.
        """
        c = self.config
        positions = layers.decoder_positions(self, tokens, positions, c.max_len)
        positions = jnp.broadcast_to(positions, tokens.shape)
        x = self.embed_in(tokens)
        x = nn.Dropout(c.dropout_rate, deterministic=deterministic)(x)
        x = nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED)
        x, _ = self.stack(deterministic)(x, segment_ids, positions)
        x = self.ln_f(x)
        if return_hidden:
            return x, self.embed_out.embedding
        logits = self.embed_out(x)
        return layers.mask_vocab_padding(logits, c.vocab_size)
