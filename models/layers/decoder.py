"""The decoder-only language model that GPT-2, GPT-NeoX, CPM-1 and Llama compose: token (and, by the family,
position) embeddings, a stack of pre-norm blocks, a final norm and the output head over the padded
vocabulary. The blocks read their options from the family config (models.config.DecoderOnlyConfig lists
them: norm, MLP activation and gating, biases, rotary embeddings, grouped KV heads, a sliding window,
parallel residual, initialisation); a family module keeps the decoder's embeddings (token table in, untied
or tied table out) or names its own (GPT-2's learned positions).

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    embed_in (or the family's embeddings)   blocks/{ln_1, attn, ln_2, mlp}   ln_f   embed_out (untied) or none
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers import kv_cache
from models.layers.attention import Attention
from models.layers.dense import BATCH_LENGTH_EMBED
from models.layers.embeddings import Embed, mask_vocab_padding, tied_logits
from models.layers.mlp import MLP
from models.layers.norms import NORMS
from models.layers.stack import LayerStack, block_stack


class DecoderBlock(nn.Module):
    """Sequential residual: h = x + attn(ln_1 x), then h + mlp(ln_2 h); parallel residual (GPT-NeoX):
    x + attn(ln_1 x) + mlp(ln_2 x). Dropout on both branches."""

    config: Any
    deterministic: bool

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array):
        c = self.config
        dtype = c.compute_dtype
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        attention = Attention(c.num_heads, c.head_dim, c.input_init_std, c.output_init_std,
                              num_kv_heads=c.num_kv_heads, qkv_bias=c.qkv_bias, out_bias=c.out_bias, rotary=c.rotary,
                              window=c.sliding_window, attention=c.attention, dropout_rate=c.attention_dropout_rate,
                              dtype=dtype, name="attn")
        mlp = MLP(c.mlp_dim, c.mlp_activation, c.input_init_std, c.output_init_std, gated=c.gated_mlp,
                  use_bias=c.mlp_bias, dtype=dtype, name="mlp")
        norm = NORMS[c.norm]
        h = norm(c.layer_norm_eps, dtype=dtype, name="ln_1")(x)
        attended = x + dropout(attention(h, deterministic=self.deterministic, segment_ids=segment_ids,
                                         positions=positions))
        h = norm(c.layer_norm_eps, dtype=dtype, name="ln_2")(x if c.use_parallel_residual else attended)
        x = attended + dropout(mlp(h))
        return nn.with_logical_constraint(x, BATCH_LENGTH_EMBED), None


def decoder_positions(module: nn.Module, tokens: jax.Array, positions: jax.Array | None,
                      max_len: int) -> jax.Array:
    """A decoder's token positions: `positions`, or 0..length-1 (shape [1, length]) when None, after
    checking the length against max_len. Decoding (a mutable 'cache') must pass them: rows may be
    left-padded, and each counts from its first real token."""
    if tokens.shape[1] > max_len:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds the model's max_len {max_len}.")
    if positions is None and kv_cache.is_decoding(module):
        raise ValueError("decoding (mutable 'cache') needs explicit positions: each row's token positions, "
                         "counting from its first real token.")
    return jnp.arange(tokens.shape[1])[None, :] if positions is None else positions


class DecoderOnly(nn.Module):
    """Decoder-only language model. `__call__` returns fp32 logits over the padded vocabulary, with
    padding ids masked so they never take probability mass.

    Its embeddings, unless a family subclass defines its own `setup`, `embed(tokens, positions)` and
    `output_table()` (GPT-2's learned positions): token embeddings in, `embed_in/embedding`, with positions
    rotary in the blocks, and an untied output table `embed_out/embedding` (GPT-NeoX, Llama), or the input's
    when the config ties them (tie_word_embeddings); both normal(input_init_std)."""

    config: Any
    layer_stack: LayerStack | None = None
    """Injected by the runtime to replace the scanned stack (e.g. by a pipeline), see layers.stack."""

    def setup(self):
        c = self.config
        table = (c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.input_init_std)
        self.embed_in = Embed(*table, dtype=c.compute_dtype)
        if not c.tie_word_embeddings:
            self.embed_out = Embed(*table, dtype=c.compute_dtype)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """The input embeddings [batch, length, embed] of tokens at positions [batch, length]."""
        return self.embed_in(tokens)

    def output_table(self) -> jax.Array:
        """The output head's table [padded_vocab, embed] (the token embeddings when tied)."""
        return (self.embed_in if self.config.tie_word_embeddings else self.embed_out).embedding

    @nn.compact
    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, deterministic: bool = True,
                 return_hidden: bool = False):
        """tokens [batch, length] -> logits [batch, length, padded_vocab] (fp32).

        positions default to 0..length-1; packed rows pass per-document positions and segment_ids
        (0 = padding). With return_hidden, returns (final hidden states, the output table
        [padded_vocab, embed]) instead, for a loss that never materialises the logits.

        KV-cache decoding (layers.kv_cache): apply with mutable=['cache']. The first such call creates a
        cache as long as its input (e.g. zeros [batch, prompt + new tokens]); each later call appends its
        tokens at the cache index. Decoding passes positions (rows may be left-padded) and segment_ids
        marking padding with 0.
        """
        c = self.config
        positions = jnp.broadcast_to(decoder_positions(self, tokens, positions, c.max_len), tokens.shape)
        x = nn.Dropout(c.dropout_rate, deterministic=deterministic)(self.embed(tokens, positions))
        x = nn.with_logical_constraint(x, BATCH_LENGTH_EMBED)
        stack = block_stack(DecoderBlock, (c, deterministic), num_layers=c.num_layers, scan_layers=c.scan_layers,
                            broadcast_args=2, remat_policy=c.remat_policy, layer_stack=self.layer_stack)
        x, _ = stack(x, segment_ids, positions)
        x = NORMS[c.norm](c.layer_norm_eps, dtype=c.compute_dtype, name="ln_f")(x)
        table = self.output_table()
        if return_hidden:
            return x, table
        return mask_vocab_padding(tied_logits(x, table.astype(c.compute_dtype)), c.vocab_size)
