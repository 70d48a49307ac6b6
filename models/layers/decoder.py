"""What the decoder-only families (GPT-2, CPM-1, GPT-NeoX, Llama) share: token (and, by the family, position)
embeddings in, a stack of the family's blocks, a final norm and the output head over the padded vocabulary.

A family file (models/<family>.py) composes its own block from the layer library, a `DecoderBlock` subclass,
and names it and its final norm on its `DecoderOnly` subclass (`block`, `final_norm`); nothing here reads a
family's options. The default embeddings are an untied token table in and out (GPT-NeoX's, Llama's);
a family replaces them with its own `setup`, `embed` and `output_table` (GPT-2's learned positions and tied
table, Qwen2's tied table).

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    embed_in/embedding   embed_out/embedding   (or the family's embeddings)
    blocks/{...the family's block...}   ln_f
"""
from __future__ import annotations

from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from models.layers import kv_cache
from models.layers.dense import BATCH_LENGTH_EMBED
from models.layers.embeddings import Embed, mask_vocab_padding, tied_logits
from models.layers.norms import RMSNorm
from models.layers.stack import LayerStack, block_stack


class DecoderBlock(nn.Module):
    """One layer of a decoder-only family, which a family subclasses and writes from the layers (its norms,
    Attention, MLP and residual wiring). The stack builds it as `Block(config, deterministic)` and calls it
    as `block(x, segment_ids, positions) -> (x, None)`: x the residual stream [batch, length, embed] (the
    stack's carry), segment_ids [batch, length] or None (packing; 0 = padding), positions [batch, length]."""

    config: Any
    deterministic: bool

    def __call__(self, x: jax.Array, segment_ids: jax.Array | None,
                 positions: jax.Array) -> tuple[jax.Array, None]:
        raise NotImplementedError(f"{type(self).__name__} must define __call__ (a family's block composes it).")


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

    A family subclass names its `block` (a DecoderBlock) and its `final_norm` (`ln_f`: LayerNorm or
    RMSNorm). Its embeddings, unless the subclass defines its own `setup`, `embed(tokens, positions)` and
    `output_table()`: token embeddings in, `embed_in/embedding` (positions are then the blocks' business,
    rotary), and an untied output table `embed_out/embedding`, both normal(config.input_init_std)."""

    config: Any
    layer_stack: LayerStack | None = None
    """Injected by the runtime to replace the scanned stack (e.g. by a pipeline), see layers.stack."""

    block: ClassVar[type[DecoderBlock]]
    """The family's block."""
    final_norm: ClassVar[type[RMSNorm]]
    """The norm after the last block (layers.LayerNorm or layers.RMSNorm)."""

    def setup(self):
        self.embed_in = self.token_table()
        self.embed_out = self.token_table()

    def token_table(self) -> Embed:
        """A token table [padded_vocab, embed], normal(input_init_std), for `setup` to name."""
        c = self.config
        return Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.input_init_std, dtype=c.compute_dtype)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """The input embeddings [batch, length, embed] of tokens at positions [batch, length]."""
        return self.embed_in(tokens)

    def output_table(self) -> jax.Array:
        """The output head's table [padded_vocab, embed]."""
        return self.embed_out.embedding

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
        stack = block_stack(self.block, (c, deterministic), num_layers=c.num_layers, scan_layers=c.scan_layers,
                            broadcast_args=2, remat_policy=c.remat_policy, layer_stack=self.layer_stack)
        x, _ = stack(x, segment_ids, positions)
        x = self.final_norm(c.layer_norm_eps, dtype=c.compute_dtype, name="ln_f")(x)
        table = self.output_table()
        if return_hidden:
            return x, table
        return mask_vocab_padding(tied_logits(x, table.astype(c.compute_dtype)), c.vocab_size)
