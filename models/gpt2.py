"""GPT-2 (Radford et al. 2019) in Flax Linen: learned positions, pre-LN blocks, GELU(tanh) MLP,
tied input/output embeddings, dropout on embeddings, attention and residual branches.

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    wte/embedding [padded_vocab, embed]   wpe/embedding [max_len, embed]
    blocks/{ln_1, attn/{query,key,value,out}_{kernel,bias}, ln_2, mlp/{fc,proj}_{kernel,bias}}
    ln_f/{scale, bias}
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar

import flax.linen as nn
import jax

from models import layers
from models.config import DecoderOnlyConfig, FamilyConfig


@dataclasses.dataclass(frozen=True)
class GPT2Config(DecoderOnlyConfig):
    """Hyper-parameters of one GPT-2; plain values only, so it round-trips through JSON."""

    RUN_FIELDS: ClassVar[tuple[str, ...]] = FamilyConfig.RUN_FIELDS + ("dropout_rate", "attention_dropout_rate")

    vocab_size: int = 50257
    max_len: int = 1024
    num_layers: int = 12
    num_heads: int = 12
    embed_dim: int = 768
    mlp_dim: int = 3072
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    layer_norm_eps: float = 1e-5
    init_std: float = 0.02
    vocab_pad_multiple: int = 128
    scan_layers: bool = True
    remat_policy: str = "none"
    attention: str = "auto"
    dtype: str = "float32"
    family: str = "gpt2"

    def __post_init__(self):
        self.check_common()
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}; "
                "choose a head count that divides the width."
            )

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    def matmul_params(self) -> int:
        """Weights each token multiplies with: the blocks and the (tied) output head, not the lookups."""
        e, m = self.embed_dim, self.mlp_dim
        block = 4 * e * e + 2 * e * m
        return self.num_layers * block + self.vocab_size * e

    def summary(self) -> str:
        return (f"gpt2: {self.num_layers} layers, width {self.embed_dim}, {self.num_heads} heads x "
                f"{self.head_dim}, mlp {self.mlp_dim}, vocab {self.vocab_size} (padded to {self.padded_vocab_size}), "
                f"max_len {self.max_len}, {self.dtype}")


class Block(nn.Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x)), with residual dropout."""

    config: GPT2Config
    deterministic: bool

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None):
        c = self.config
        dtype = c.compute_dtype
        out_std = layers.scaled_residual_std(c.init_std, c.num_layers)
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        h = layers.LayerNorm(c.layer_norm_eps, dtype=dtype, name="ln_1")(x)
        h = layers.SelfAttention(c.num_heads, c.head_dim, c.init_std, out_std, c.attention,
                                 c.attention_dropout_rate, dtype=dtype, name="attn")(
            h, segment_ids, self.deterministic)
        x = x + dropout(h)
        h = layers.LayerNorm(c.layer_norm_eps, dtype=dtype, name="ln_2")(x)
        h = layers.MLP(c.mlp_dim, c.init_std, out_std, dtype=dtype, name="mlp")(h)
        x = x + dropout(h)
        return nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED), None


class GPT2(nn.Module):
    """Decoder-only language model. `__call__` returns fp32 logits over the padded vocabulary,
    with padding ids masked so they never take probability mass."""

    config: GPT2Config
    layer_stack: Callable[[type[nn.Module], type[nn.Module]], Callable[..., nn.Module]] | None = None
    """Injected by the runtime to replace the scanned stack (e.g. by a pipeline): called with the
    block class and the nn.scan stack class, returns a constructor called like the stack class."""

    def setup(self):
        c = self.config
        dtype = c.compute_dtype
        self.wte = layers.Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.init_std, dtype=dtype)
        self.wpe = layers.Embed(c.max_len, c.embed_dim, ("position", "embed"), c.init_std, dtype=dtype)
        self.ln_f = layers.LayerNorm(c.layer_norm_eps, dtype=dtype)

    def stack(self, deterministic: bool) -> Callable:
        c = self.config
        return layers.block_stack(layers.remat(Block, c.remat_policy), (c, deterministic), num_layers=c.num_layers,
                                  scan_layers=c.scan_layers, broadcast_args=1, layer_stack=self.layer_stack)

    @nn.compact
    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, deterministic: bool = True,
                 return_hidden: bool = False):
        """tokens [batch, length] -> logits [batch, length, padded_vocab] (fp32).

        positions default to 0..length-1; packed rows pass per-document positions and
        segment_ids (0 = padding). With return_hidden, returns (final hidden states, the tied
        embedding table) instead, for a loss that never materialises the logits.

        KV-cache decoding: apply with mutable=['cache']. The first such call creates a cache as
        long as its input (e.g. zeros [batch, prompt + new tokens]); each later call appends its
        tokens at the cache index. Decoding passes positions (rows may be left-padded) and
        segment_ids marking padding with 0.
        """
        c = self.config
        positions = layers.decoder_positions(self, tokens, positions, c.max_len)
        x = self.wte(tokens) + self.wpe(positions)
        x = nn.Dropout(c.dropout_rate, deterministic=deterministic)(x)
        x = nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED)
        x, _ = self.stack(deterministic)(x, segment_ids)
        x = self.ln_f(x)
        if return_hidden:
            return x, self.wte.embedding
        logits = self.wte.attend(x)
        return layers.mask_vocab_padding(logits, c.vocab_size)
