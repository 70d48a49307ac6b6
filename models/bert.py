"""BERT (Devlin et al. 2019) and RoBERTa (Liu et al. 2019) in Flax Linen: learned positions and
token-type embeddings summed and layer-normed, post-LN blocks (x = LN(x + attention(x)), then
x = LN(x + mlp(x))), exact (erf) GELU, biases everywhere, bidirectional attention. RoBERTa is the
same network with its positions offset past the padding id (position_offset 2: a token's position
is pad_token_id + 1 + its index) and one token type.

Two heads ('head'): 'mlm', the masked-LM head (dense, GELU, LayerNorm, then the output tied to the
word embeddings plus a bias per id), or 'classification' ([CLS]'s final state -> dense -> tanh ->
dropout -> linear over num_labels: BERT's pooler + classifier, RoBERTa's classification head).

Parameter tree (scan_layers=True stacks the blocks on a leading 'layers' axis under `blocks`;
scan_layers=False names them `block_0`, `block_1`, ...):

    embeddings/{word, position, token_type}/embedding   embeddings/norm/{scale, bias}
    blocks/{attention/{query,key,value}_{kernel,bias}, attention/out_{kernel,bias}, attention_norm,
            mlp/{fc,proj}_{kernel,bias}, mlp_norm}
    mlm_head/{dense/{kernel,bias}, norm/{scale,bias}, bias [padded_vocab]}          (head 'mlm')
    classifier_head/{pooler, classifier}/{kernel, bias}                             (head 'classification')
"""
from __future__ import annotations

import dataclasses
from typing import Callable, ClassVar, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models.config import EncoderOnlyConfig
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class BertConfig(EncoderOnlyConfig):
    """Hyper-parameters of one BERT (the sizes, heads and run choices are EncoderOnlyConfig's, with
    BERT-base's defaults); plain values only, so it round-trips through JSON."""

    HEAD_PARAMS: ClassVar[tuple[str, ...]] = ("mlm_head", "classifier_head")

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = EncoderOnlyConfig.POSITIVE_FIELDS + ("max_len", "type_vocab_size")

    family: str = "bert"
    vocab_size: int = 30522
    max_len: int = 512
    """Position embeddings; position_offset of them come before the first token (RoBERTa: 2), so rows
    hold at most max_len - position_offset tokens."""
    type_vocab_size: int = 2
    position_offset: int = 0
    pad_token_id: int = 0
    """The padding id, from which RoBERTa counts its positions."""
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02

    def __post_init__(self):
        super().__post_init__()
        self.check_position_offset()
        if not 0 <= self.position_offset < self.max_len:
            raise ValueError(f"position_offset {self.position_offset} must be in [0, max_len {self.max_len}).")

    def check_position_offset(self) -> None:
        """BERT counts positions from 0 (RoBERTa's family offsets them past its padding id)."""
        if self.position_offset:
            raise ValueError(f"position_offset {self.position_offset}: bert counts positions from 0 (family "
                             "'roberta' offsets them past its padding id); leave position_offset at 0.")

    def max_input_length(self) -> int:
        return self.max_len - self.position_offset

    def matmul_params(self) -> int:
        """Weights each token multiplies with: the blocks, and with the MLM head its transform and the
        tied output (the loss forms every position's logits)."""
        e, m = self.embed_dim, self.mlp_dim
        blocks = self.num_layers * (4 * e * e + 2 * e * m)
        return blocks + (e * e + self.vocab_size * e if self.head == "mlm" else 0)

    def train_flops_per_example(self, lengths: Mapping[str, int]) -> float:
        """6 FLOPs per weight per token, plus bidirectional attention (QK^T and AV over all T x T
        scores, 3x for forward + backward): 12·L·T²·d; the classification head runs once per row."""
        t, e = lengths["inputs"], self.embed_dim
        head = 6.0 * (e * e + e * self.num_labels) if self.head == "classification" else 0.0
        return 6.0 * self.matmul_params() * t + 12.0 * self.num_layers * t * t * e + head

    def pipeline_stacks(self) -> dict[str, int]:
        raise ValueError("pipeline parallelism is not supported for encoder-only models (BERT, RoBERTa) yet; set "
                         "PIPELINE_PARALLEL=1 and shard with FSDP_PARALLEL / TENSOR_PARALLEL instead.")

    def summary(self) -> str:
        head = "masked-LM head" if self.head == "mlm" else f"classification head of {self.num_labels} labels"
        return (f"{self.family}: {self.num_layers} layers, width {self.embed_dim}, {self.num_heads} heads x "
                f"{self.head_dim}, mlp {self.mlp_dim}, vocab {self.vocab_size} (padded to {self.padded_vocab_size}), "
                f"{self.max_input_length()} positions, {self.type_vocab_size} token types, {head}, {self.dtype}")


@dataclasses.dataclass(frozen=True)
class RobertaConfig(BertConfig):
    """RoBERTa: BERT with positions offset past the padding id (1), one token type, LayerNorm eps 1e-5."""

    vocab_size: int = 50265
    max_len: int = 514
    type_vocab_size: int = 1
    position_offset: int = 2
    pad_token_id: int = 1
    layer_norm_eps: float = 1e-5
    family: str = "roberta"

    def check_position_offset(self) -> None:
        """RoBERTa's first position is pad_token_id + 1 (transformers' create_position_ids_from_input_ids)."""
        if self.position_offset != self.pad_token_id + 1:
            raise ValueError(f"position_offset {self.position_offset} with pad_token_id {self.pad_token_id}: roberta's "
                             f"positions start past the padding id; set position_offset to {self.pad_token_id + 1}.")


def norm(c: BertConfig, name: str) -> layers.LayerNorm:
    return layers.LayerNorm(c.layer_norm_eps, dtype=c.compute_dtype, name=name)


class Embeddings(nn.Module):
    """LayerNorm(word + position + token type), then dropout; also returns the word table (the MLM
    head's tied output)."""

    config: BertConfig

    @nn.compact
    def __call__(self, tokens: jax.Array, positions: jax.Array, token_types: jax.Array,
                 deterministic: bool) -> tuple[jax.Array, jax.Array]:
        c = self.config
        dtype = c.compute_dtype
        word = layers.Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), c.init_std, dtype=dtype,
                            name="word")
        x = word(tokens)
        x += layers.Embed(c.max_len, c.embed_dim, ("position", "embed"), c.init_std, dtype=dtype,
                          name="position")(positions)
        x += layers.Embed(c.type_vocab_size, c.embed_dim, (None, "embed"), c.init_std, dtype=dtype,
                          name="token_type")(token_types)
        x = nn.Dropout(c.dropout_rate, deterministic=deterministic)(norm(c, "norm")(x))
        return nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED), word.embedding


class Block(nn.Module):
    """Post-LN: x = LN(x + dropout(attention(x))), then x = LN(x + dropout(mlp(x)))."""

    config: BertConfig
    deterministic: bool

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, kv_segment_ids: jax.Array | None):
        c = self.config
        dtype = c.compute_dtype
        dropout = nn.Dropout(c.dropout_rate, deterministic=self.deterministic)
        h = layers.Attention(c.num_heads, c.head_dim, c.init_std, c.init_std, causal=False, qkv_bias=True,
                             out_bias=True, attention=c.attention, dropout_rate=c.attention_dropout_rate, dtype=dtype,
                             name="attention")(
            x, deterministic=self.deterministic, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids)
        x = norm(c, "attention_norm")(x + dropout(h))
        h = layers.MLP(c.mlp_dim, "gelu", c.init_std, c.init_std, use_bias=True, dtype=dtype, name="mlp")(x)
        x = norm(c, "mlp_norm")(x + dropout(h))
        return nn.with_logical_constraint(x, layers.BATCH_LENGTH_EMBED), None


class MLMHead(nn.Module):
    """dense, GELU (erf), LayerNorm; then the tied word embeddings plus a bias per id. Returns the
    transformed states with a constant 1 appended and the table with the bias appended as a column,
    so that hidden @ table.T are the logits (what the chunked cross-entropy takes)."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array, word_embeddings: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = self.config
        x = layers.Dense(c.embed_dim, ("embed", "mlp"), c.init_std, dtype=c.compute_dtype, name="dense")(x)
        x = norm(c, "norm")(jax.nn.gelu(x, approximate=False))
        bias = layers.logical_param(self, "bias", nn.initializers.zeros, (c.padded_vocab_size,), ("vocab",),
                                    jnp.float32)
        hidden = jnp.concatenate([x, jnp.ones(x.shape[:-1] + (1,), x.dtype)], axis=-1)
        table = jnp.concatenate([word_embeddings, bias[:, None].astype(word_embeddings.dtype)], axis=-1)
        return hidden, table


class ClassificationHead(nn.Module):
    """[CLS]'s final state -> dense -> tanh (BERT's pooler) -> dropout -> linear over num_labels."""

    config: BertConfig

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        c = self.config
        dtype = c.compute_dtype
        pooled = jnp.tanh(layers.Dense(c.embed_dim, ("embed", "mlp"), c.init_std, dtype=dtype, name="pooler")(x[:, 0]))
        pooled = nn.Dropout(c.dropout_rate, deterministic=deterministic)(pooled)
        logits = layers.Dense(c.num_labels, ("mlp", None), c.init_std, dtype=dtype, name="classifier")(pooled)
        return logits.astype(jnp.float32)


def default_positions(c: BertConfig, tokens: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
    """Unpacked rows' positions as transformers computes them: BERT 0..length-1; RoBERTa (offset > 0)
    pad_token_id + 1 + the index among the row's real tokens, and pad_token_id on padding."""
    if c.position_offset == 0:
        return jnp.arange(tokens.shape[1])[None, :]
    real = tokens != c.pad_token_id if segment_ids is None else segment_ids != 0
    return jnp.where(real, jnp.cumsum(real, axis=1) - 1 + c.position_offset, c.position_offset - 1)


class BERT(nn.Module):
    """Encoder-only model. `__call__` returns, for head 'mlm', fp32 logits over the padded vocabulary
    (padding ids masked) at every position; for head 'classification', fp32 logits [batch, num_labels]."""

    config: BertConfig

    def stack(self, deterministic: bool) -> Callable:
        c = self.config
        return layers.block_stack(Block, (c, deterministic), num_layers=c.num_layers, scan_layers=c.scan_layers,
                                  broadcast_args=2, remat_policy=c.remat_policy)

    @nn.compact
    def __call__(self, tokens: jax.Array, *, token_types: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
                 deterministic: bool = True, return_hidden: bool = False):
        """tokens [batch, length]; token_types default to 0. segment_ids mark padding with 0; alone (an
        unpacked row) they mask only the padding keys, as transformers' attention mask. Packed rows pass
        per-document `positions` (from 0; the offset is added here) with segment ids 1, 2, ...: each
        token attends within its own document. With return_hidden and head 'mlm', returns (hidden,
        table) whose product is the logits (MLMHead), for a loss that never materialises them."""
        c = self.config
        if tokens.shape[1] > c.max_input_length():
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds the model's {c.max_input_length()} positions.")
        packed = positions is not None
        positions = positions + c.position_offset if packed else default_positions(c, tokens, segment_ids)
        token_types = jnp.zeros_like(tokens) if token_types is None else token_types
        x, word = Embeddings(c, name="embeddings")(tokens, positions, token_types, deterministic)
        x, _ = self.stack(deterministic)(x, segment_ids if packed else None, None if packed else segment_ids)
        if c.head == "classification":
            return ClassificationHead(c, name="classifier_head")(x, deterministic)
        hidden, table = MLMHead(c, name="mlm_head")(x, word)
        if return_hidden:
            return hidden, table
        logits = jnp.einsum("bte,ve->btv", hidden, table.astype(hidden.dtype), preferred_element_type=jnp.float32)
        return layers.mask_vocab_padding(logits, c.vocab_size)


FAMILIES = {"bert": Family(BertConfig, BERT, "encoder_only"), "roberta": Family(RobertaConfig, BERT, "encoder_only")}
