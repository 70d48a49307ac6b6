"""T5 (Raffel et al. 2020) in Flax Linen: an encoder-decoder with RMS norms before every sub-layer,
relative position biases (one table per stack, computed once and shared by its layers), no
1/sqrt(d) attention scaling, and no biases anywhere. v1.0: ReLU MLP, output tied to the input
embedding with a d_model^-0.5 scaling. v1.1 / mT5: gated-GELU MLP, untied output head, no scaling.
transformers >= 5.2 ties every T5 and records the scaling apart (scale_decoder_outputs): a v1.1 it
builds is tied and unscaled.

Parameter tree (scan_layers=True stacks each stack's blocks on a leading 'layers' axis under
`blocks`; scan_layers=False names them `block_0`, `block_1`, ...):

    token_embedder/embedding [padded_vocab, embed]           (shared by encoder, decoder and, tied, the output)
    encoder/relpos_bias/embedding [buckets, heads]
    encoder/blocks/{pre_attention_norm, attention/{query,key,value,out}_kernel, pre_mlp_norm,
                    mlp/{fc,gate,proj}_kernel}                  (gate_kernel only when gated)
    encoder/final_norm/scale
    decoder/relpos_bias/embedding [buckets, heads]
    decoder/blocks/{pre_self_attention_norm, self_attention, pre_cross_attention_norm,
                    cross_attention, pre_mlp_norm, mlp}
    decoder/final_norm/scale
    lm_head/embedding [padded_vocab, embed]                   (untied only)
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models.config import FamilyConfig
from models.layers import kv_cache
from models.registry import Family

FEED_FORWARD = {"relu": ("relu", False), "gated-gelu": ("gelu_tanh", True)}
"""feed_forward -> (activation, gated), named as in transformers' T5Config.feed_forward_proj."""


@dataclasses.dataclass(frozen=True)
class T5Config(FamilyConfig):
    """Hyper-parameters of one T5 (the run choices are FamilyConfig's; the sizes too, with T5-small's
    defaults); plain values only, so it round-trips through JSON."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = FamilyConfig.POSITIVE_FIELDS + (
        "num_decoder_layers", "d_kv", "relative_attention_num_buckets", "relative_attention_max_distance")

    family: str = "t5"
    vocab_size: int = 32100
    num_layers: int = 6
    num_decoder_layers: int = 6
    """The decoder's depth (num_layers is the encoder's)."""
    num_heads: int = 8
    embed_dim: int = 512
    d_kv: int = 64
    """The per-head width, free of embed_dim / num_heads."""
    mlp_dim: int = 2048
    feed_forward: str = "relu"
    """'relu' (T5 v1.0) or 'gated-gelu' (T5 v1.1, mT5): FEED_FORWARD."""
    tie_word_embeddings: bool = True
    scale_decoder_outputs: bool | None = None
    """Multiply the decoder output by embed_dim^-0.5 before the head (None: as tie_word_embeddings, T5 v1.0
    and v1.1 alike)."""
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_eps: float = 1e-6
    init_factor: float = 1.0
    """Multiplies every initialiser's standard deviation (transformers' initializer_factor)."""

    def __post_init__(self):
        if self.scale_decoder_outputs is None:
            object.__setattr__(self, "scale_decoder_outputs", self.tie_word_embeddings)
        super().__post_init__()
        if self.feed_forward not in FEED_FORWARD:
            raise ValueError(f"feed_forward {self.feed_forward!r} is unknown; choose one of {sorted(FEED_FORWARD)} "
                             "('relu' for T5 v1.0, 'gated-gelu' for T5 v1.1 / mT5).")
        if self.relative_attention_num_buckets < 4 or self.relative_attention_max_distance < 2:
            raise ValueError(f"relative_attention_num_buckets {self.relative_attention_num_buckets} / max_distance "
                             f"{self.relative_attention_max_distance} are too small; T5 uses 32 / 128.")

    @property
    def mlp_activation(self) -> tuple[str, bool]:
        """(activation, gated) of the MLP: FEED_FORWARD's entry (a variant's config may name its own)."""
        return FEED_FORWARD[self.feed_forward]

    @property
    def gated(self) -> bool:
        return self.mlp_activation[1]

    def decoder_start_ids(self) -> tuple[int, ...]:
        """The ids the decoder starts from, before the first target (T5: the padding id 0, seqio's shift)."""
        return (0,)

    def inputs_end_with_eos(self) -> bool:
        """Whether the encoder reads EOS after each input text (T5: seqio's append_eos)."""
        return True

    def targets_end_id(self, eod_id: int) -> int:
        """The id that ends every target (T5: the tokenizer's EOS)."""
        return eod_id

    @property
    def head_dim(self) -> int:
        return self.d_kv

    def matmul_params(self) -> tuple[int, int, int]:
        """Weights each token multiplies with: (per encoder token, per decoder token, per encoder token
        in the decoder's cross-attention keys/values). The output head counts on the decoder side."""
        e, inner = self.embed_dim, self.num_heads * self.d_kv
        attention = 4 * e * inner
        mlp = (3 if self.gated else 2) * e * self.mlp_dim
        encoder = self.num_layers * (attention + mlp)
        decoder = self.num_decoder_layers * (attention + attention // 2 + mlp) + self.vocab_size * e
        return encoder, decoder, self.num_decoder_layers * attention // 2

    def train_flops_per_example(self, lengths: Mapping[str, int]) -> float:
        """6 FLOPs per weight per token, plus attention (3x forward for forward + backward): the
        encoder's full I x I scores 12·L·I²·hd, the decoder's causal half 6·L·T²·hd and its
        cross-attention 12·L·T·I·hd, with hd = heads·d_kv."""
        i, t = lengths["inputs"], lengths["targets"]
        encoder, decoder, cross_kv = self.matmul_params()
        inner = self.num_heads * self.d_kv
        attention = (12 * self.num_layers * i * i
                     + self.num_decoder_layers * (6 * t * t + 12 * t * i)) * inner
        return 6.0 * (encoder * i + decoder * t + cross_kv * i) + attention

    def check_lengths(self, lengths: Mapping[str, int]) -> None:
        if set(lengths) != {"inputs", "targets"}:
            raise ValueError(f"FEATURE_LENGTHS={dict(lengths)}: an encoder-decoder model takes 'inputs' and "
                             "'targets' lengths, e.g. FEATURE_LENGTHS={'inputs': 512, 'targets': 114}.")
        for name, length in lengths.items():
            if length < 1:
                raise ValueError(f"FEATURE_LENGTHS[{name!r}]={length} must be positive.")

    def pipeline_stacks(self) -> dict[str, int]:
        """The encoder, then the decoder: each is pipelined over every stage in turn."""
        return {"num_layers": self.num_layers, "num_decoder_layers": self.num_decoder_layers}

    def summary(self) -> str:
        output = "tied" if self.tie_word_embeddings else "untied"
        if self.scale_decoder_outputs != self.tie_word_embeddings:
            output += ", scaled" if self.scale_decoder_outputs else ", unscaled"
        return (f"{self.family}: {self.num_layers}+{self.num_decoder_layers} layers, width {self.embed_dim}, "
                f"{self.num_heads} heads x {self.d_kv}, mlp {self.mlp_dim} ({self.feed_forward}), vocab "
                f"{self.vocab_size} (padded to {self.padded_vocab_size}), {output} output, {self.dtype}")


def norm(c: T5Config, name: str) -> layers.RMSNorm:
    return layers.RMSNorm(c.layer_norm_eps, dtype=c.compute_dtype, name=name)


def attention(c: T5Config, causal: bool, name: str) -> layers.Attention:
    """T5's initialisation (as transformers'): the query carries the 1/sqrt(d_kv) that the scale omits."""
    e, f = c.embed_dim, c.init_factor
    return layers.Attention(c.num_heads, c.d_kv, f * e**-0.5, f * (c.num_heads * c.d_kv) ** -0.5,
                            query_init_std=f * (e * c.d_kv) ** -0.5, causal=causal, scale=1.0, attention=c.attention,
                            dropout_rate=c.dropout_rate, dtype=c.compute_dtype, name=name)


def mlp(c: T5Config) -> layers.MLP:
    activation, gated = c.mlp_activation
    return layers.MLP(c.mlp_dim, activation, c.init_factor * c.embed_dim**-0.5, c.init_factor * c.mlp_dim**-0.5,
                      gated=gated, dropout_rate=c.dropout_rate, dtype=c.compute_dtype, name="mlp")


class EncoderBlock(nn.Module):
    """x + attention(norm(x)) with the stack's bidirectional bias, then x + mlp(norm(x))."""

    config: T5Config
    deterministic: bool

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, segment_ids: jax.Array | None):
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        h = norm(c, "pre_attention_norm")(x)
        h = attention(c, False, "attention")(h, deterministic=self.deterministic, segment_ids=segment_ids, bias=bias)
        x = x + dropout(h)
        h = mlp(c)(norm(c, "pre_mlp_norm")(x), self.deterministic)
        x = x + dropout(h)
        return nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED), None


class DecoderBlock(nn.Module):
    """Causal self-attention with the stack's bias, cross-attention over the encoder output (no
    bias), then the MLP; each pre-normed, with residual dropout."""

    config: T5Config
    deterministic: bool

    @nn.compact
    def __call__(self, x: jax.Array, bias: jax.Array, segment_ids: jax.Array | None, encoded: jax.Array | None,
                 encoder_segment_ids: jax.Array | None):
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        h = norm(c, "pre_self_attention_norm")(x)
        h = attention(c, True, "self_attention")(h, deterministic=self.deterministic, segment_ids=segment_ids,
                                                 bias=bias)
        x = x + dropout(h)
        h = norm(c, "pre_cross_attention_norm")(x)
        h = attention(c, False, "cross_attention")(
            h, deterministic=self.deterministic, cross=True, context=encoded, context_segment_ids=encoder_segment_ids,
            segment_ids=segment_ids if encoder_segment_ids is not None else None)
        x = x + dropout(h)
        h = mlp(c)(norm(c, "pre_mlp_norm")(x), self.deterministic)
        x = x + dropout(h)
        return nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED), None


def stack(block: type[nn.Module], c: T5Config, num_layers: int, deterministic: bool, num_inputs: int,
          layer_stack: layers.LayerStack | None) -> Callable[..., tuple[jax.Array, None]]:
    """The blocks of one stack (layers.block_stack), called as f(x, *inputs); every input but x is
    broadcast to all layers (the bias is computed once, outside). `layer_stack`: the runtime's
    replacement for the scanned stack (a pipeline), as T5.layer_stack."""
    return layers.block_stack(block, (c, deterministic), num_layers=num_layers, scan_layers=c.scan_layers,
                              broadcast_args=num_inputs, remat_policy=c.remat_policy, layer_stack=layer_stack)


def relpos_bias(c: T5Config, bidirectional: bool) -> layers.RelativePositionBias:
    return layers.RelativePositionBias(c.relative_attention_num_buckets, c.relative_attention_max_distance,
                                       c.num_heads, bidirectional, c.init_factor * c.embed_dim**-0.5,
                                       name="relpos_bias")


def default_positions(tokens: jax.Array) -> jax.Array:
    return jnp.arange(tokens.shape[1])[None, :]


class Encoder(nn.Module):
    config: T5Config
    layer_stack: layers.LayerStack | None = None

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
                 deterministic: bool) -> jax.Array:
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=deterministic)
        bias = relpos_bias(c, bidirectional=True)(positions, positions)
        x = nn.with_logical_constraint(dropout(x), layers.BATCH_LENGTH_EMBED)
        x, _ = stack(EncoderBlock, c, c.num_layers, deterministic, 2, self.layer_stack)(x, bias, segment_ids)
        return dropout(norm(c, "final_norm")(x))


class Decoder(nn.Module):
    """Decoding (mutable 'cache'): the first call creates the caches (as long as its input); later
    calls append their tokens. The stack caches the token positions so that the relative bias
    covers every cached slot; positions default to the next slots."""

    config: T5Config
    layer_stack: layers.LayerStack | None = None

    def key_positions(self, positions: jax.Array | None, batch: int, length: int) -> tuple[jax.Array, jax.Array]:
        """(query positions, key positions); decoding reads and extends the cached positions."""
        decoding = kv_cache.is_decoding(self)
        if not (decoding and kv_cache.has(self, "cached_positions")):
            positions = jnp.arange(length)[None, :] if positions is None else positions
            if decoding:
                kv_cache.create(self, {"cached_positions": jnp.zeros((batch, length), jnp.int32)})
            return positions, positions
        if positions is None:
            positions = (kv_cache.read(self, kv_cache.INDEX)[0] + jnp.arange(length))[None, :]
        positions = jnp.broadcast_to(positions, (batch, length)).astype(jnp.int32)
        _, cached = kv_cache.append(self, {"cached_positions": positions})
        return positions, cached["cached_positions"]

    @nn.compact
    def __call__(self, x: jax.Array, encoded: jax.Array | None, positions: jax.Array | None,
                 segment_ids: jax.Array | None, encoder_segment_ids: jax.Array | None,
                 deterministic: bool) -> jax.Array:
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=deterministic)
        query_positions, key_positions = self.key_positions(positions, *x.shape[:2])
        bias = relpos_bias(c, bidirectional=False)(query_positions, key_positions)
        x = nn.with_logical_constraint(dropout(x), layers.BATCH_LENGTH_EMBED)
        x, _ = stack(DecoderBlock, c, c.num_decoder_layers, deterministic, 4, self.layer_stack)(
            x, bias, segment_ids, encoded, encoder_segment_ids)
        return dropout(norm(c, "final_norm")(x))


class T5(nn.Module):
    """Encoder-decoder language model. `__call__` returns fp32 logits over the padded vocabulary for
    the decoder tokens, with padding ids masked so they never take probability mass."""

    config: T5Config
    layer_stack: layers.LayerStack | None = None
    """Injected by the runtime to replace each scanned stack, the encoder's and the decoder's (e.g.
    by a pipeline): called with the block class and the nn.scan stack class, returns a constructor
    called like the stack class. Decoding builds the model without it."""

    def setup(self):
        c = self.config
        embed = functools.partial(layers.Embed, c.padded_vocab_size, c.embed_dim, ("vocab", "embed"),
                                  dtype=c.compute_dtype)
        self.token_embedder = embed(c.init_factor)
        self.encoder = Encoder(c, self.layer_stack)
        self.decoder = Decoder(c, self.layer_stack)
        if not c.tie_word_embeddings:
            # T5X's untied head: variance scaling over fan-in (std d_model^-0.5), so the first logits
            # are O(1) and the first loss is near ln(vocab) rather than tens of nats.
            self.lm_head = embed(c.init_factor * c.embed_dim**-0.5)

    def __call__(self, encoder_input_tokens: jax.Array, decoder_input_tokens: jax.Array, *,
                 encoder_segment_ids: jax.Array | None = None, decoder_segment_ids: jax.Array | None = None,
                 encoder_positions: jax.Array | None = None, decoder_positions: jax.Array | None = None,
                 deterministic: bool = True, return_hidden: bool = False):
        """Tokens [batch, inputs] and [batch, targets] -> logits [batch, targets, padded_vocab] (fp32).

        Packed rows pass segment ids (0 = padding) and per-document positions on both sides; a
        decoder token attends to the encoder tokens of its own segment. Unpacked rows may pass
        encoder_segment_ids alone as the encoder's padding mask. With return_hidden, returns
        (decoder hidden states, output table [padded_vocab, embed]) instead, the states already
        scaled by embed_dim^-0.5 when scale_decoder_outputs, so hidden @ table.T are the logits.
        """
        encoded = self.encode(encoder_input_tokens, encoder_segment_ids=encoder_segment_ids,
                              encoder_positions=encoder_positions, deterministic=deterministic)
        return self.decode(encoded, decoder_input_tokens, encoder_segment_ids=encoder_segment_ids,
                           decoder_segment_ids=decoder_segment_ids, decoder_positions=decoder_positions,
                           deterministic=deterministic, return_hidden=return_hidden)

    def encode(self, encoder_input_tokens: jax.Array, *, encoder_segment_ids: jax.Array | None = None,
               encoder_positions: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
        """The encoder's output [batch, inputs, embed]."""
        positions = default_positions(encoder_input_tokens) if encoder_positions is None else encoder_positions
        x = self.token_embedder(encoder_input_tokens)
        return self.encoder(x, positions, encoder_segment_ids, deterministic)

    def decode(self, encoded: jax.Array | None, decoder_input_tokens: jax.Array, *,
               encoder_segment_ids: jax.Array | None = None, decoder_segment_ids: jax.Array | None = None,
               decoder_positions: jax.Array | None = None, deterministic: bool = True, return_hidden: bool = False):
        """Decoder logits (or hidden states, see __call__) given the encoder's output.

        KV-cache decoding: apply with mutable=['cache']. The first such call creates the caches,
        as long as its decoder input (e.g. zeros [batch, max decode length]); each later call
        appends its tokens. The first call after creation passes `encoded`, whose cross-attention
        keys/values are cached; later calls pass encoded=None. encoder_segment_ids (the encoder's
        padding) go with every call.
        """
        c = self.config
        x = self.token_embedder(decoder_input_tokens)
        x = self.decoder(x, encoded, decoder_positions, decoder_segment_ids, encoder_segment_ids, deterministic)
        if c.scale_decoder_outputs:
            x = x * c.embed_dim**-0.5
        table = self.token_embedder.embedding if c.tie_word_embeddings else self.lm_head.embedding
        if return_hidden:
            return x, table
        logits = jnp.einsum("bte,ve->btv", x, table.astype(c.compute_dtype), preferred_element_type=jnp.float32)
        return layers.mask_vocab_padding(logits, c.vocab_size)


FAMILIES = {"t5": Family(T5Config, T5, "encoder_decoder")}
