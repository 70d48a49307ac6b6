"""Transformer building blocks with logical-axis annotations.

Every parameter is created through `nn.with_logical_partitioning` and every einsum names its
dimensions, so that a mesh plus rules (see partitioning/) decide the layout. Kernels are
stored in `param_dtype` and cast to the compute `dtype` at use.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops
from jax.ad_checkpoint import checkpoint_name

from models.attention import dot_product_attention

Initializer = Callable[..., jax.Array]

BATCH_LENGTH_EMBED = ("activation_batch", "activation_length", "activation_embed")
BATCH_LENGTH_HEADS_KV = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
BATCH_LENGTH_MLP = ("activation_batch", "activation_length", "activation_mlp")
CACHE_BATCH_LENGTH = ("activation_batch", "activation_length")


def logical_param(module: nn.Module, name: str, init: Initializer, shape: Sequence[int],
                  axes: Sequence[str | None], dtype) -> jax.Array:
    """A parameter carrying logical axis names (one per dimension)."""
    return module.param(name, nn.with_logical_partitioning(init, tuple(axes)), tuple(shape), dtype)


FP8_STATE = fp8_ops.OVERWRITE_WITH_GRADIENT
"""The variable collection holding the FP8 matmuls' scales and amax histories (flax's name): not
parameters but state, whose "gradient" is its next value (the trainer overwrites it, no optimizer)."""


class Einsum(nn.Module):
    """`jnp.einsum(equation, x, kernel)` of a dense layer (x activations, kernel the weight in the compute
    dtype), or the same in FP8 with delayed scaling through flax's FP8 ops (as its Fp8Einsum, which
    XLA's GPU compiler rewrites into cuBLASLt FP8 GEMMs): operands quantised to e4m3 and the output's
    gradient to e5m2, each with a scale from the amax history of earlier steps.

    FP8 runs when the module has its state: created at init when the FP8_STATE collection is mutable
    (LanguageModel.init asks for it when model_config.matmul_dtype == 'fp8'), used whenever applied
    with it. Applied without it (eval, generate, converters: parameters only) the matmul runs in the
    compute dtype. The state's variables are flax's Fp8Einsum's, scalars and histories replicated."""

    amax_history_length: int = 1024

    def fp8_state(self, name: str, init: Callable[[tuple[int, ...]], jax.Array], length: int) -> jax.Array:
        boxed = nn.with_logical_partitioning(lambda: init((length,), jnp.float32), (None,))
        return self.variable(FP8_STATE, name, boxed).value

    @nn.compact
    def __call__(self, equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
        fp8 = (self.is_mutable_collection(FP8_STATE) if self.is_initializing()
               else self.has_variable(FP8_STATE, "input_scale"))
        if not fp8:
            return jnp.einsum(equation, x, kernel)
        state = {f"{arg}_scale": self.fp8_state(f"{name}_scale", jnp.ones, 1)
                 for arg, name in (("lhs", "input"), ("rhs", "kernel"), ("grad", "output_grad"))}
        state.update({f"{arg}_amax_history": self.fp8_state(f"{name}_amax_history", jnp.zeros,
                                                            self.amax_history_length)
                      for arg, name in (("lhs", "input"), ("rhs", "kernel"), ("grad", "output_grad"))})
        dot_general = functools.partial(fp8_ops.fp8_scaled_dot_general, quantize_compute_type=kernel.dtype, **state)
        return jnp.einsum(equation, x.astype(kernel.dtype), kernel, _dot_general=dot_general)


def dense_einsum(name: str, equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
    """A dense layer's matmul through `Einsum` (FP8 when the model has FP8 state), named `<name>_einsum`."""
    return Einsum(name=f"{name}_einsum")(equation, x, kernel)


class Embed(nn.Module):
    """A lookup table [num_embeddings, features]; `attend` is the tied output projection."""

    num_embeddings: int
    features: int
    axes: tuple[str, str]
    init_std: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def setup(self):
        self.embedding = logical_param(
            self, "embedding", nn.initializers.normal(self.init_std),
            (self.num_embeddings, self.features), self.axes, self.param_dtype,
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.embedding, ids, axis=0).astype(self.dtype)

    def attend(self, x: jax.Array) -> jax.Array:
        """x @ embedding.T with an fp32 result (the logits feed a softmax)."""
        return tied_logits(x, self.embedding.astype(self.dtype))


@jax.custom_vjp
def tied_logits(x: jax.Array, embedding: jax.Array) -> jax.Array:
    """[b, t, e] @ [v, e].T -> fp32 [b, t, v]. The backward casts the fp32 logit gradient to the
    operands' dtype first, so its two matmuls run in bf16 (fp32 accumulation) as the forward's
    does; left to autodiff they would promote to fp32 (TF32 on GPUs: ~13% of a GPT-2 124M step
    on an H100, docs/benchmarks.md)."""
    return jnp.einsum("bte,ve->btv", x, embedding, preferred_element_type=jnp.float32)


def _tied_logits_fwd(x, embedding):
    return tied_logits(x, embedding), (x, embedding)


def _tied_logits_bwd(residuals, g):
    x, embedding = residuals
    g = g.astype(x.dtype)
    d_x = jnp.einsum("btv,ve->bte", g, embedding, preferred_element_type=jnp.float32)
    d_embedding = jnp.einsum("btv,bte->ve", g, x, preferred_element_type=jnp.float32)
    return d_x.astype(x.dtype), d_embedding.astype(embedding.dtype)


tied_logits.defvjp(_tied_logits_fwd, _tied_logits_bwd)


class LMHead(Embed):
    """An untied output projection stored like an embedding table [padded_vocab, embed] (axes
    ('vocab', 'embed')), so that the chunked cross-entropy takes it as it takes a tied table.
    Calling it gives fp32 logits (`attend`)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.attend(x)


class LayerNorm(nn.Module):
    """LayerNorm over the last axis, computed in fp32, with 'embed'-named scale and bias."""

    epsilon: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        features = x.shape[-1]
        scale = logical_param(self, "scale", nn.initializers.ones, (features,), ("embed",), self.param_dtype)
        bias = logical_param(self, "bias", nn.initializers.zeros, (features,), ("embed",), self.param_dtype)
        x = x.astype(jnp.float32)
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.epsilon)
        return (y * scale + bias).astype(self.dtype)


class Dense(nn.Module):
    """x @ kernel + bias over the last axis: kernel [in, features] and bias [features] named by `axes`
    (input, output) and initialised normal(init_std) / zeros (BERT's pooler and MLM transform)."""

    features: int
    axes: tuple[str | None, str | None]
    init_std: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = logical_param(self, "kernel", nn.initializers.normal(self.init_std), (x.shape[-1], self.features),
                               self.axes, self.param_dtype)
        bias = logical_param(self, "bias", nn.initializers.zeros, (self.features,), self.axes[1:], self.param_dtype)
        y = dense_einsum("kernel", "...i,io->...o", x.astype(self.dtype), kernel.astype(self.dtype))
        return y + bias.astype(self.dtype)


class MLP(nn.Module):
    """fc (embed -> mlp), GELU, proj (mlp -> embed); proj initialised with `out_init_std`.
    GELU is the tanh approximation (GPT-2) unless `approximate_gelu` is False (exact erf form)."""

    mlp_dim: int
    init_std: float
    out_init_std: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    approximate_gelu: bool = True

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        embed = x.shape[-1]
        p = self.param_dtype
        fc_kernel = logical_param(self, "fc_kernel", nn.initializers.normal(self.init_std),
                                  (embed, self.mlp_dim), ("embed", "mlp"), p)
        fc_bias = logical_param(self, "fc_bias", nn.initializers.zeros, (self.mlp_dim,), ("mlp",), p)
        proj_kernel = logical_param(self, "proj_kernel", nn.initializers.normal(self.out_init_std),
                                    (self.mlp_dim, embed), ("mlp", "embed"), p)
        proj_bias = logical_param(self, "proj_bias", nn.initializers.zeros, (embed,), ("embed",), p)
        h = dense_einsum("fc", "bte,em->btm", x, fc_kernel.astype(self.dtype)) + fc_bias.astype(self.dtype)
        h = nn.with_logical_constraint(h, BATCH_LENGTH_MLP)
        h = checkpoint_name(jax.nn.gelu(h, approximate=self.approximate_gelu), "mlp_hidden")
        out = dense_einsum("proj", "btm,me->bte", h, proj_kernel.astype(self.dtype)) + proj_bias.astype(self.dtype)
        return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)


def apply_rotary(x: jax.Array, positions: jax.Array, rotary_dim: int, base: float) -> jax.Array:
    """Rotary position embeddings (RoPE) in GPT-NeoX's rotate-half layout on the first `rotary_dim`
    dims of each head: dims i and i + rotary_dim/2 form a pair rotated by position * base^(-2i/rotary_dim);
    the remaining dims pass through. x [batch, length, heads, head_dim]; positions [batch or 1, length]."""
    half = rotary_dim // 2
    inv_freq = 1.0 / base ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim)
    angles = positions[..., None].astype(jnp.float32) * inv_freq  # [batch, length, half]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles).astype(x.dtype), jnp.sin(angles).astype(x.dtype)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    rotated_half = jnp.concatenate([-rot[..., half:], rot[..., :half]], axis=-1)
    return jnp.concatenate([rot * cos + rotated_half * sin, rest], axis=-1)


class SelfAttention(nn.Module):
    """Multi-head self-attention with biases; q/k/v kernels [embed, heads, kv], out [heads, kv, embed].
    With `rotary_dim` > 0, queries and keys get rotary position embeddings (`apply_rotary`) at the
    positions passed in."""

    num_heads: int
    head_dim: int
    init_std: float
    out_init_std: float
    attention: str
    dropout_rate: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    rotary_dim: int = 0
    rotary_base: float = 10000.0

    def projection(self, name: str, x: jax.Array) -> jax.Array:
        embed = x.shape[-1]
        kernel = logical_param(self, f"{name}_kernel", nn.initializers.normal(self.init_std),
                               (embed, self.num_heads, self.head_dim), ("embed", "heads", "kv"),
                               self.param_dtype)
        bias = logical_param(self, f"{name}_bias", nn.initializers.zeros,
                             (self.num_heads, self.head_dim), ("heads", "kv"), self.param_dtype)
        y = dense_einsum(name, "bte,ehd->bthd", x, kernel.astype(self.dtype)) + bias.astype(self.dtype)
        return checkpoint_name(nn.with_logical_constraint(y, BATCH_LENGTH_HEADS_KV), f"{name}_proj")

    def create_cache(self, key: jax.Array, value: jax.Array) -> None:
        """Zeroed decoding cache as long as this input: keys, values, which slots hold real tokens,
        and the next slot to write."""
        batch, length = key.shape[:2]
        for name, like in (("cached_key", key), ("cached_value", value)):
            self.variable("cache", name, nn.with_logical_partitioning(jnp.zeros, BATCH_LENGTH_HEADS_KV),
                          like.shape, like.dtype)
        self.variable("cache", "cached_valid", nn.with_logical_partitioning(jnp.zeros, CACHE_BATCH_LENGTH),
                      (batch, length), jnp.bool_)
        self.variable("cache", "cache_index", nn.with_logical_partitioning(jnp.zeros, ()), (), jnp.int32)

    def cached_attention(self, query: jax.Array, key: jax.Array, value: jax.Array,
                         segment_ids: jax.Array | None) -> jax.Array:
        """Write this chunk's keys/values at the cache index, then let each query attend to the
        cached slots up to its own that hold real tokens (segment id != 0)."""
        batch, length = query.shape[:2]
        index = self.get_variable("cache", "cache_index")
        valid = jnp.ones((batch, length), jnp.bool_) if segment_ids is None else segment_ids != 0
        updates = {"cached_key": key, "cached_value": value, "cached_valid": valid}
        for name, update in updates.items():
            cached = self.get_variable("cache", name)
            self.put_variable("cache", name, jax.lax.dynamic_update_slice_in_dim(cached, update, index, axis=1))
        self.put_variable("cache", "cache_index", index + length)
        slots = jnp.arange(self.get_variable("cache", "cached_key").shape[1])
        causal = slots[None, :] <= (index + jnp.arange(length))[:, None]
        mask = causal[None, None] & self.get_variable("cache", "cached_valid")[:, None, None, :]
        return jax.nn.dot_product_attention(query, self.get_variable("cache", "cached_key"),
                                            self.get_variable("cache", "cached_value"), mask=mask,
                                            implementation="xla")

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, deterministic: bool,
                 positions: jax.Array | None = None) -> jax.Array:
        """Causal self-attention. Decoding: applied with a mutable 'cache' collection, the first call
        creates a cache as long as its input and attends normally; later calls go through the cache.
        `positions` [batch or 1, length] are needed with rotary embeddings (cached keys keep theirs)."""
        embed = x.shape[-1]
        q, k, v = (self.projection(name, x) for name in ("query", "key", "value"))
        if self.rotary_dim:
            if positions is None:
                raise ValueError("rotary embeddings need positions; pass each token's position.")
            q, k = (apply_rotary(y, positions, self.rotary_dim, self.rotary_base) for y in (q, k))
        decoding = self.is_mutable_collection("cache") and not self.is_initializing()
        if decoding and self.has_variable("cache", "cached_key"):
            out = self.cached_attention(q, k, v, segment_ids)
        else:
            if decoding:
                self.create_cache(k, v)
            dropout = 0.0 if deterministic else self.dropout_rate
            rng = self.make_rng("dropout") if dropout > 0.0 else None
            out = dot_product_attention(q, k, v, causal=True, segment_ids=segment_ids,
                                        implementation=self.attention, dropout_rate=dropout, dropout_rng=rng)
        out = checkpoint_name(nn.with_logical_constraint(out, BATCH_LENGTH_HEADS_KV), "attention_out")
        out_kernel = logical_param(self, "out_kernel", nn.initializers.normal(self.out_init_std),
                                   (self.num_heads, self.head_dim, embed), ("heads", "kv", "embed"),
                                   self.param_dtype)
        out_bias = logical_param(self, "out_bias", nn.initializers.zeros, (embed,), ("embed",), self.param_dtype)
        y = dense_einsum("out", "bthd,hde->bte", out, out_kernel.astype(self.dtype)) + out_bias.astype(self.dtype)
        return nn.with_logical_constraint(y, BATCH_LENGTH_EMBED)


def decoder_positions(module: nn.Module, tokens: jax.Array, positions: jax.Array | None,
                      max_len: int) -> jax.Array:
    """A decoder's token positions: `positions`, or 0..length-1 (shape [1, length]) when None, after
    checking the length against max_len. Decoding (a mutable 'cache') must pass them: rows may be
    left-padded, and each counts from its first real token."""
    if tokens.shape[1] > max_len:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds the model's max_len {max_len}.")
    if positions is None and module.is_mutable_collection("cache") and not module.is_initializing():
        raise ValueError("decoding (mutable 'cache') needs explicit positions: each row's token positions, "
                         "counting from its first real token.")
    return jnp.arange(tokens.shape[1])[None, :] if positions is None else positions


def mask_vocab_padding(logits: jax.Array, vocab_size: int) -> jax.Array:
    """Logits [batch, length, padded_vocab] with the ids at or past vocab_size at the float32 minimum,
    so that padding rows never take probability."""
    logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, jnp.finfo(jnp.float32).min)
    return nn.with_logical_constraint(logits, ("activation_batch", "activation_length", "activation_vocab"))


# Where block_stack puts the layers' parameters: scanned, one stack `blocks` on a leading 'layers' axis;
# unrolled, `block_0`, `block_1`, ... (checkpoints and the optimizer read these names).
STACKED = "blocks"
UNROLLED = "block_{}"


def block_stack(block: type[nn.Module], block_args: tuple, *, num_layers: int, scan_layers: bool,
                broadcast_args: int, layer_stack: Callable | None = None) -> Callable:
    """A model's `num_layers` blocks `block(*block_args)` applied in turn, called `(x, *args) -> (x, None)`
    with `broadcast_args` extra arguments every layer sees. scan_layers: one nn.scan named `blocks`
    (parameters and cache stacked on a leading 'layers' axis), which `layer_stack(block, stack)` (the
    runtime's hook, e.g. a pipeline) may replace; else unrolled modules `block_0`, `block_1`, ...
    Call it from the model's compact method: the blocks become the model's children."""
    if not scan_layers:
        if layer_stack is not None:
            raise ValueError("a replaced layer stack (pipeline parallelism) needs scan_layers=True; "
                             "set model_config.scan_layers = True.")
        blocks = [block(*block_args, name=UNROLLED.format(i)) for i in range(num_layers)]

        def apply_in_turn(x, *args):
            for layer in blocks:
                x, _ = layer(x, *args)
            return x, None

        return apply_in_turn
    stack = nn.scan(
        block,
        variable_axes={"params": 0, "cache": 0, FP8_STATE: 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * broadcast_args,
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    if layer_stack is not None:
        stack = layer_stack(block, stack)
    return stack(*block_args, name=STACKED)


class RMSNorm(nn.Module):
    """T5's layer norm: x / sqrt(mean(x²) + eps) * scale, fp32 statistics, no mean, no bias."""

    epsilon: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = logical_param(self, "scale", nn.initializers.ones, (x.shape[-1],), ("embed",), self.param_dtype)
        x = x.astype(jnp.float32)
        y = x * jax.lax.rsqrt(jnp.square(x).mean(-1, keepdims=True) + self.epsilon)
        return (y * scale).astype(self.dtype)


def relative_position_bucket(relative_position: jax.Array, *, bidirectional: bool, num_buckets: int,
                             max_distance: int) -> jax.Array:
    """T5's bucket of (key position - query position): distances below half the buckets get their own
    bucket, longer ones share log-spaced buckets up to max_distance (and the last bucket beyond).
    Bidirectional splits the buckets between keys before and after the query; otherwise keys after
    the query all fall into bucket 0."""
    buckets = jnp.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = (relative_position > 0).astype(relative_position.dtype) * num_buckets
        distance = jnp.abs(relative_position)
    else:
        distance = jnp.maximum(-relative_position, 0)
    max_exact = num_buckets // 2
    log_ratio = jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact) / math.log(max_distance / max_exact)
    large = jnp.minimum(max_exact + (log_ratio * (num_buckets - max_exact)).astype(distance.dtype), num_buckets - 1)
    return buckets + jnp.where(distance < max_exact, distance, large)


class RelativePositionBias(nn.Module):
    """T5's learned attention bias per (bucket of relative position, head): a table
    [num_buckets, heads], computed once per stack and added to every layer's logits."""

    num_buckets: int
    max_distance: int
    num_heads: int
    bidirectional: bool
    init_std: float
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, query_positions: jax.Array, key_positions: jax.Array) -> jax.Array:
        """Positions [batch or 1, q_len] and [batch or 1, kv_len] -> fp32 bias [batch or 1, heads, q_len, kv_len]."""
        table = logical_param(self, "embedding", nn.initializers.normal(self.init_std),
                              (self.num_buckets, self.num_heads), ("relpos_buckets", "heads"), self.param_dtype)
        buckets = relative_position_bucket(
            key_positions[:, None, :] - query_positions[:, :, None], bidirectional=self.bidirectional,
            num_buckets=self.num_buckets, max_distance=self.max_distance)
        bias = jnp.take(table.astype(jnp.float32), buckets, axis=0)
        return jnp.transpose(bias, (0, 3, 1, 2))


FEED_FORWARD_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu, "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True)}


class FeedForward(nn.Module):
    """T5's MLP without biases: proj(act(fc x)) (v1.0: ReLU) or, gated, proj(act(gate x) * fc x)
    (v1.1: GELU(tanh)); dropout on the hidden activations."""

    mlp_dim: int
    activation: str
    gated: bool
    init_std: float
    out_init_std: float
    dropout_rate: float
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def kernel(self, name: str, shape: tuple[int, int], axes: tuple[str, str], std: float) -> jax.Array:
        return logical_param(self, name, nn.initializers.normal(std), shape, axes, self.param_dtype).astype(self.dtype)

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        embed = x.shape[-1]
        activation = FEED_FORWARD_ACTIVATIONS[self.activation]
        fc = self.kernel("fc_kernel", (embed, self.mlp_dim), ("embed", "mlp"), self.init_std)
        h = nn.with_logical_constraint(dense_einsum("fc", "bte,em->btm", x, fc), BATCH_LENGTH_MLP)
        if self.gated:
            gate = self.kernel("gate_kernel", (embed, self.mlp_dim), ("embed", "mlp"), self.init_std)
            g = nn.with_logical_constraint(dense_einsum("gate", "bte,em->btm", x, gate), BATCH_LENGTH_MLP)
            h = activation(g) * h
        else:
            h = activation(h)
        h = checkpoint_name(h, "mlp_hidden")
        h = nn.Dropout(self.dropout_rate, deterministic=deterministic)(h)
        proj = self.kernel("proj_kernel", (self.mlp_dim, embed), ("mlp", "embed"), self.out_init_std)
        return nn.with_logical_constraint(dense_einsum("proj", "btm,me->bte", h, proj), BATCH_LENGTH_EMBED)


class Attention(nn.Module):
    """Multi-head attention without projection biases (T5), or with them (`use_bias`, BERT):
    self-attention, causal or not, or cross-attention over a `context`; an additive `bias` and a
    logit `scale` (T5: 1.0, its query init carries 1/sqrt(head_dim) instead). head_dim is free of
    the width (T5's d_kv).
    Kernels: query/key/value [embed, heads, kv], out [heads, kv, embed].

    Decoding (mutable 'cache'): self-attention caches keys and values like SelfAttention, and the
    bias then covers every cache slot [batch, heads, q_len, cache_len]. Cross-attention caches the
    context's keys and values on the first call given a context; later calls pass context=None.
    """

    num_heads: int
    head_dim: int
    query_init_std: float
    init_std: float
    out_init_std: float
    causal: bool
    attention: str
    dropout_rate: float
    scale: float | None = None
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32
    use_bias: bool = False
    """Biases on the query/key/value ([heads, kv]) and output ([embed]) projections (BERT)."""

    def projection(self, name: str, x: jax.Array, std: float) -> jax.Array:
        kernel = logical_param(self, f"{name}_kernel", nn.initializers.normal(std),
                               (x.shape[-1], self.num_heads, self.head_dim), ("embed", "heads", "kv"),
                               self.param_dtype)
        y = dense_einsum(name, "bte,ehd->bthd", x, kernel.astype(self.dtype))
        if self.use_bias:
            bias = logical_param(self, f"{name}_bias", nn.initializers.zeros, (self.num_heads, self.head_dim),
                                 ("heads", "kv"), self.param_dtype)
            y = y + bias.astype(self.dtype)
        return checkpoint_name(nn.with_logical_constraint(y, BATCH_LENGTH_HEADS_KV), f"{name}_proj")

    def cache_variable(self, name: str, like: jax.Array, axes: tuple[str, ...]) -> nn.Variable:
        return self.variable("cache", name, nn.with_logical_partitioning(jnp.zeros, axes), like.shape, like.dtype)

    def self_attention_cache(self, key: jax.Array, value: jax.Array, segment_ids: jax.Array | None):
        """Write this chunk's keys/values at the cache index; the mask lets each query see the
        filled slots up to its own that hold real tokens (segment id != 0)."""
        batch, length = key.shape[:2]
        valid = jnp.ones((batch, length), jnp.bool_) if segment_ids is None else segment_ids != 0
        index = self.get_variable("cache", "cache_index")
        for name, update in (("cached_key", key), ("cached_value", value), ("cached_valid", valid)):
            cached = self.get_variable("cache", name)
            self.put_variable("cache", name, jax.lax.dynamic_update_slice_in_dim(cached, update, index, axis=1))
        self.put_variable("cache", "cache_index", index + length)
        slots = jnp.arange(self.get_variable("cache", "cached_key").shape[1])
        causal = slots[None, :] <= (index + jnp.arange(length))[:, None]
        mask = causal[None, None] & self.get_variable("cache", "cached_valid")[:, None, None, :]
        return self.get_variable("cache", "cached_key"), self.get_variable("cache", "cached_value"), mask

    def create_self_attention_cache(self, key: jax.Array, value: jax.Array) -> None:
        for name, like in (("cached_key", key), ("cached_value", value)):
            self.cache_variable(name, like, BATCH_LENGTH_HEADS_KV)
        self.cache_variable("cached_valid", jnp.zeros(key.shape[:2], jnp.bool_), CACHE_BATCH_LENGTH)
        self.cache_variable("cache_index", jnp.zeros((), jnp.int32), ())

    def context_keys_values(self, context: jax.Array | None, decoding: bool) -> tuple[jax.Array, jax.Array]:
        """Cross-attention keys/values: projected from the context (and cached when decoding), or,
        when decoding without a context, read from the cache."""
        if context is None:
            if not (decoding and self.has_variable("cache", "cached_key")):
                raise ValueError("cross-attention without a context reads the decoding cache: pass the encoder "
                                 "output on the first decoding call.")
            return self.get_variable("cache", "cached_key"), self.get_variable("cache", "cached_value")
        key, value = self.projection("key", context, self.init_std), self.projection("value", context, self.init_std)
        if decoding:
            self.cache_variable("cached_key", key, BATCH_LENGTH_HEADS_KV).value = key
            self.cache_variable("cached_value", value, BATCH_LENGTH_HEADS_KV).value = value
        return key, value

    @nn.compact
    def __call__(self, x: jax.Array, *, deterministic: bool, segment_ids: jax.Array | None = None,
                 bias: jax.Array | None = None, context: jax.Array | None = None,
                 context_segment_ids: jax.Array | None = None, cross: bool = False,
                 kv_segment_ids: jax.Array | None = None) -> jax.Array:
        """x [batch, q_len, embed] -> [batch, q_len, embed]. cross=True attends over `context`
        (whose padding / documents are `context_segment_ids`), else over x itself. Self-attention
        with `kv_segment_ids` alone masks only the padding keys (segment 0): padding queries still
        attend to the real tokens, as BERT's attention mask does."""
        q = self.projection("query", x, self.query_init_std)
        decoding = self.is_mutable_collection("cache") and not self.is_initializing()
        dropout = 0.0 if deterministic else self.dropout_rate
        rng = self.make_rng("dropout") if dropout > 0.0 else None
        if cross:
            k, v = self.context_keys_values(context, decoding)
            out = dot_product_attention(q, k, v, causal=False, segment_ids=segment_ids,
                                        kv_segment_ids=context_segment_ids, bias=bias, scale=self.scale,
                                        implementation=self.attention, dropout_rate=dropout, dropout_rng=rng)
        else:
            k, v = self.projection("key", x, self.init_std), self.projection("value", x, self.init_std)
            if decoding and self.has_variable("cache", "cached_key"):
                k, v, mask = self.self_attention_cache(k, v, segment_ids)
                out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=self.scale,
                                                   implementation="xla")
            else:
                if decoding:
                    self.create_self_attention_cache(k, v)
                out = dot_product_attention(q, k, v, causal=self.causal, segment_ids=segment_ids,
                                            kv_segment_ids=kv_segment_ids, bias=bias, scale=self.scale,
                                            implementation=self.attention, dropout_rate=dropout, dropout_rng=rng)
        out = checkpoint_name(nn.with_logical_constraint(out, BATCH_LENGTH_HEADS_KV), "attention_out")
        out_kernel = logical_param(self, "out_kernel", nn.initializers.normal(self.out_init_std),
                                   (self.num_heads, self.head_dim, x.shape[-1]), ("heads", "kv", "embed"),
                                   self.param_dtype)
        y = dense_einsum("out", "bthd,hde->bte", out, out_kernel.astype(self.dtype))
        if self.use_bias:
            out_bias = logical_param(self, "out_bias", nn.initializers.zeros, (x.shape[-1],), ("embed",),
                                     self.param_dtype)
            y = y + out_bias.astype(self.dtype)
        return nn.with_logical_constraint(y, BATCH_LENGTH_EMBED)


REMAT_POLICIES: dict[str, Callable | None] = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj"),
    "minimal_offloaded": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}
"""Named rematerialisation policies ('none' = keep every activation, no remat). 'minimal_offloaded'
saves what 'minimal' saves in host memory instead of device memory (GPU/TPU)."""


def remat(block: type[nn.Module], policy: str) -> type[nn.Module]:
    """Wrap a block class in nn.remat with a named policy; 'none' returns it unchanged."""
    if policy == "none":
        return block
    if policy not in REMAT_POLICIES:
        raise ValueError(
            f"remat policy {policy!r} is unknown; choose 'none' or one of {sorted(REMAT_POLICIES)}."
        )
    return nn.remat(block, policy=REMAT_POLICIES[policy], prevent_cse=True)


def scaled_residual_std(init_std: float, num_layers: int) -> float:
    """GPT-2's residual-projection init: std / sqrt(2 * n_layer)."""
    return init_std / math.sqrt(2 * num_layers)
