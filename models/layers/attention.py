"""Multi-head attention, the one module every family uses: self-attention (causal or not) or cross-attention
over a context, with the KV cache for decoding (models/layers/kv_cache.py) and the scores computed by
models.attention.dot_product_attention (its 'auto' / xla / cudnn / pallas / splash implementations)."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from models.attention import dot_product_attention
from models.layers import kv_cache
from models.layers.dense import BATCH_LENGTH_EMBED, BATCH_LENGTH_HEADS_KV, add_bias, dense_einsum, normal_param
from models.layers.norms import RMSNorm
from models.layers.positions import Rotary


class Attention(nn.Module):
    """Kernels query [embed, heads, head_dim], key and value [embed, kv_heads, head_dim] and out
    [heads, head_dim, embed] (logical axes embed, heads, kv; normal(init_std), the query normal(query_init_std)
    when given, out normal(out_init_std)); with `qkv_bias` biases query/key/value_bias [heads, head_dim], with
    `out_bias` out_bias [embed] (zeros). head_dim is free of the width (T5's d_kv).

    Options: grouped key/value heads (`num_kv_heads` dividing num_heads; None: as many as the queries),
    `rotary` embeddings of queries and keys at the tokens' positions, a logit `scale` (None: 1/sqrt(head_dim);
    T5: 1.0, its query init carrying the factor instead) and, per call, an additive `bias` on the logits
    (T5's relative positions: [batch or 1, heads, q_len, kv_len], covering every cache slot when decoding).
    `window`: a causal sliding window of that many keys for self-attention (Mistral's sliding_window: each
    token sees itself and the window - 1 tokens before it, padding included; None: no window), in the
    forward pass and when decoding through the cache. `qk_norm_eps`: an RMSNorm over each head of the queries
    and of the keys, with this epsilon, before rotary (Qwen3's q_norm / k_norm: query_norm/scale and
    key_norm/scale [head_dim], logical axis kv, ones; None: no norm).
    """

    num_heads: int
    head_dim: int
    init_std: float
    out_init_std: float
    query_init_std: float | None = None
    num_kv_heads: int | None = None
    causal: bool = True
    window: int | None = None
    qkv_bias: bool = False
    out_bias: bool = False
    rotary: Rotary | None = None
    qk_norm_eps: float | None = None
    scale: float | None = None
    attention: str = "auto"
    dropout_rate: float = 0.0
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def projection(self, name: str, x: jax.Array, heads: int, std: float) -> jax.Array:
        kernel = normal_param(self, f"{name}_kernel", std, (x.shape[-1], heads, self.head_dim),
                              ("embed", "heads", "kv"), self.param_dtype)
        y = dense_einsum(name, "bte,ehd->bthd", x, kernel.astype(self.dtype))
        y = add_bias(self, y, f"{name}_bias", (heads, self.head_dim), ("heads", "kv"), self.qkv_bias)
        if self.qk_norm_eps is not None and name != "value":
            y = RMSNorm(self.qk_norm_eps, dtype=self.dtype, param_dtype=self.param_dtype, axis="kv",
                        name=f"{name}_norm")(y)
        return checkpoint_name(nn.with_logical_constraint(y, BATCH_LENGTH_HEADS_KV), f"{name}_proj")

    def keys_values(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        heads = self.num_kv_heads or self.num_heads
        return self.projection("key", x, heads, self.init_std), self.projection("value", x, heads, self.init_std)

    def context_keys_values(self, context: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """Cross-attention's keys/values: projected from the context (and kept in the cache when
        decoding), or, when decoding without a context, the cached ones."""
        decoding = kv_cache.is_decoding(self)
        if context is not None:
            key, value = self.keys_values(context)
            if decoding:
                kv_cache.keep(self, {"cached_key": key, "cached_value": value})
            return key, value
        if not (decoding and kv_cache.has(self, "cached_key")):
            raise ValueError("cross-attention without a context reads the decoding cache: pass the encoder "
                             "output on the first decoding call.")
        return kv_cache.read(self, "cached_key", "cached_value")

    def rotate(self, q: jax.Array, k: jax.Array, positions: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        if self.rotary is None:
            return q, k
        if positions is None:
            raise ValueError("rotary embeddings need positions; pass each token's position.")
        return self.rotary(q, positions), self.rotary(k, positions)

    @nn.compact
    def __call__(self, x: jax.Array, *, deterministic: bool = True, segment_ids: jax.Array | None = None,
                 positions: jax.Array | None = None, bias: jax.Array | None = None, cross: bool = False,
                 context: jax.Array | None = None, context_segment_ids: jax.Array | None = None,
                 kv_segment_ids: jax.Array | None = None) -> jax.Array:
        """x [batch, q_len, embed] -> [batch, q_len, embed]. cross=True attends over `context` (whose padding
        / documents are `context_segment_ids`), else over x itself. `positions` [batch or 1, q_len] place
        the rotary embeddings. Self-attention with `kv_segment_ids` alone masks only the padding keys
        (segment 0): padding queries still attend to the real tokens, as BERT's attention mask does.

        Decoding (kv_cache): self-attention writes its keys/values at the cache index and attends over
        the cache; cross-attention caches the context's keys/values on the first call given a context,
        later calls pass context=None."""
        q = self.projection("query", x, self.num_heads,
                            self.init_std if self.query_init_std is None else self.query_init_std)
        dropout = 0.0 if deterministic else self.dropout_rate
        options = dict(bias=bias, scale=self.scale, implementation=self.attention, dropout_rate=dropout,
                       dropout_rng=self.make_rng("dropout") if dropout > 0.0 else None)
        if cross:
            k, v = self.context_keys_values(context)
            out = dot_product_attention(q, k, v, causal=False, segment_ids=segment_ids,
                                        kv_segment_ids=context_segment_ids, **options)
        else:
            k, v = self.keys_values(x)
            q, k = self.rotate(q, k, positions)
            cached = kv_cache.self_attention(self, k, v, segment_ids, window=self.window)
            if cached is None:
                out = dot_product_attention(q, k, v, causal=self.causal, segment_ids=segment_ids,
                                            kv_segment_ids=kv_segment_ids, window=self.window, **options)
            else:
                k, v, mask = cached
                out = jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=self.scale,
                                                   implementation="xla")
        out = checkpoint_name(nn.with_logical_constraint(out, BATCH_LENGTH_HEADS_KV), "attention_out")
        embed = x.shape[-1]
        kernel = normal_param(self, "out_kernel", self.out_init_std, (self.num_heads, self.head_dim, embed),
                              ("heads", "kv", "embed"), self.param_dtype)
        y = dense_einsum("out", "bthd,hde->bte", out, kernel.astype(self.dtype))
        y = add_bias(self, y, "out_bias", (embed,), ("embed",), self.out_bias)
        return nn.with_logical_constraint(y, BATCH_LENGTH_EMBED)
