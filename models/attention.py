"""Attention entry point: one signature, several implementations.

`dot_product_attention` takes BTNH tensors (batch, length, heads, head_dim), as
`jax.nn.dot_product_attention` does. Key/value may carry fewer heads than the query
(grouped-query / multi-query attention); query heads are split evenly over them. Key/value may
have another length than the query (cross-attention), an additive `bias` may be added to the
logits (T5's relative positions) and `scale` replaces 1/sqrt(head_dim) (T5 uses 1.0). A causal sliding
`window` W (Mistral's sliding_window) lets query i, at key position i' = i + kv_len - q_len, see key j only
when 0 <= i' - j < W; every implementation serves it ('xla' and 'cudnn' by their masks, 'splash' and 'pallas'
skipping the key blocks wholly outside it), so 'auto' needs no other choice for it.

The model never holds a mesh: for 'pallas' and 'splash' this module reads the ambient one
(`jax.sharding.get_abstract_mesh()`, entered by the trainer with `jax.set_mesh`) and the active
Flax logical-axis rules, and runs the kernel per shard inside `jax.shard_map`. The ambient mesh's
devices also name the platform 'auto' chooses for, so compiling for a TPU topology from a CPU
machine (`python -m t5x_like.compile --topology=v5p:...`) compiles what a TPU would run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from absl import logging
from jax.sharding import PartitionSpec as P

from models.kernels import flash_attention_tuning as attention_tuning
from models.kernels.sharding import active_mesh, axes_size, mesh_axes
from models.kernels.window import check_window

if TYPE_CHECKING:  # the kernels import Pallas (0.5 s of CPU a process): loaded by the calls that run them
    from models.kernels import splash_attention as splash

IMPLEMENTATIONS = ("auto", "xla", "cudnn", "pallas", "splash")


BIAS_IMPLEMENTATIONS = ("xla", "cudnn")
"""The implementations that add an additive bias to the logits. cudnn_attention's call was checked on
one H100 (jax 0.11.2, bf16): bias [1, heads, q, kv] with a key-padding mask, scale 1.0 and 1/8,
causal 128x128, cross 128x256 and GQA 8/2 heads over 64x192 all lowered to cuDNN, max abs error
<= 0.0095 against an fp32 reference."""


def attention_mask(
    q_len: int, kv_len: int, *, causal: bool, segment_ids: jax.Array | None,
    kv_segment_ids: jax.Array | None = None, window: int | None = None,
) -> jax.Array | None:
    """Boolean [batch or 1, 1, q_len, kv_len] mask of allowed (query, key) pairs, or None.

    Segment id 0 marks padding: a padding query attends nowhere and no query attends to it.
    kv_segment_ids are the keys' own ids (cross-attention); they default to segment_ids. With
    kv_segment_ids alone, only the padding keys are masked. window (with causal): query i sees key j
    only when i + kv_len - q_len - j < window.
    """
    mask = None
    if causal:
        distance = jnp.arange(q_len)[:, None] + (kv_len - q_len) - jnp.arange(kv_len)[None, :]
        mask = distance >= 0
        if window is not None:
            mask &= distance < window
        mask = mask[None, None]
    if kv_segment_ids is None:
        kv_segment_ids = segment_ids
    if kv_segment_ids is not None:
        same = jnp.broadcast_to((kv_segment_ids != 0)[:, None, :], (kv_segment_ids.shape[0], q_len, kv_len))
        if segment_ids is not None:
            same &= segment_ids[:, :, None] == kv_segment_ids[:, None, :]
        same = same[:, None]
        mask = same if mask is None else mask & same
    return mask


def check_segment_ids(query, key, segment_ids, kv_segment_ids) -> None:
    """Segment ids must be [batch, length] of their side; keys of another length need their own."""
    batch, q_len, kv_len = query.shape[0], query.shape[1], key.shape[1]
    if segment_ids is not None and segment_ids.shape != (batch, q_len):
        raise ValueError(f"segment_ids has shape {segment_ids.shape}; it must be [batch, query length] = "
                         f"{(batch, q_len)}.")
    if kv_segment_ids is not None and kv_segment_ids.shape != (batch, kv_len):
        raise ValueError(f"kv_segment_ids has shape {kv_segment_ids.shape}; it must be [batch, key length] = "
                         f"{(batch, kv_len)}.")
    if segment_ids is not None and kv_segment_ids is None and q_len != kv_len:
        raise ValueError(f"query length {q_len} differs from key length {kv_len}: pass the keys' own "
                         "kv_segment_ids with segment_ids (cross-attention).")


def xla_attention(query, key, value, *, causal, segment_ids, kv_segment_ids=None, bias=None, scale=None,
                  dropout_rate=0.0, dropout_rng=None, window=None):
    """Reference attention in plain jnp: fp32 logits and softmax, bias, masks (a causal window among them),
    optional dropout on the probabilities."""
    batch, q_len, num_heads, head_dim = query.shape
    kv_heads = key.shape[2]
    if num_heads % kv_heads:
        raise ValueError(
            f"query has {num_heads} heads, key/value {kv_heads}: the query heads must be a multiple "
            "of the key/value heads (grouped-query attention)."
        )
    group = num_heads // kv_heads
    query = query.reshape(batch, q_len, kv_heads, group, head_dim)
    kv_len = key.shape[1]
    logits = jnp.einsum("bqkgh,bskh->bkgqs", query, key, preferred_element_type=jnp.float32)
    logits *= head_dim**-0.5 if scale is None else scale
    if bias is not None:
        logits += bias.astype(jnp.float32).reshape(bias.shape[0], kv_heads, group, q_len, kv_len)
    mask = attention_mask(q_len, kv_len, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
                          window=check_window(window, causal))
    if mask is not None:
        logits = jnp.where(mask[:, :, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    if mask is not None:  # rows with no allowed key (padding) give zeros, not a uniform average
        probs = jnp.where(mask[:, :, None], probs, 0.0)
    if dropout_rate > 0.0:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    out = jnp.einsum("bkgqs,bskh->bqkgh", probs.astype(value.dtype), value)
    return out.reshape(batch, q_len, num_heads, head_dim)


def cudnn_attention(query, key, value, *, causal, segment_ids, kv_segment_ids=None, bias=None, scale=None,
                    window=None):
    """cuDNN fused attention through jax.nn.dot_product_attention (GPU only); takes a bias. A window
    goes in as local_window_size (W - 1, 0): cuDNN's sliding_window_length W, each token's keys
    (pos - W, pos]. jax's causal mask and window are aligned top-left, so queries of another length
    than the keys get our bottom-right causal mask (and window) in the boolean mask instead."""
    window = check_window(window, causal)
    q_len, kv_len = query.shape[1], key.shape[1]
    in_mask = causal and q_len != kv_len
    mask = None
    if segment_ids is not None or kv_segment_ids is not None or in_mask:
        mask = attention_mask(q_len, kv_len, causal=in_mask, segment_ids=segment_ids,
                              kv_segment_ids=kv_segment_ids, window=window if in_mask else None)
    if bias is not None:
        bias = bias.astype(query.dtype)
    local_window = None if window is None or in_mask else (window - 1, 0)
    return jax.nn.dot_product_attention(
        query, key, value, bias=bias, mask=mask, scale=scale, is_causal=causal and not in_mask,
        local_window_size=local_window, implementation="cudnn")


def per_shard(kernel, query, key, value, segment_ids):
    """kernel(q, k, v, segment_ids) directly, or under a mesh per shard inside shard_map.

    Batch goes over the axes 'activation_batch' maps to and heads over those of 'activation_heads'
    (each dropped when it does not divide the size), so no shard gathers another's q/k/v. K/V heads
    that do not split over the head axes are repeated first, just enough that every shard holds the
    K/V heads of its own query heads.
    """
    mesh = active_mesh()
    if mesh is None:
        return kernel(query, key, value, segment_ids)
    batch_axes = mesh_axes("activation_batch", mesh, query.shape[0])
    head_axes = mesh_axes("activation_heads", mesh, query.shape[2])
    key, value = repeat_kv_heads(key, value, query.shape[2], axes_size(mesh, head_axes))
    heads_spec = P(batch_axes or None, None, head_axes or None, None)
    args, specs = [query, key, value], [heads_spec] * 3
    if segment_ids is not None:
        args.append(segment_ids)
        specs.append(P(batch_axes or None, None))

    def one_shard(q, k, v, segments=None):
        return kernel(q, k, v, segments)

    return jax.shard_map(
        one_shard, mesh=mesh, in_specs=tuple(specs), out_specs=heads_spec,
        axis_names=frozenset(mesh.auto_axes), check_vma=False,
    )(*args)


def repeat_kv_heads(key, value, num_heads: int, shards: int):
    """K/V with each head repeated r times in place, the smallest r that splits them over `shards`
    (num_heads, a multiple of shards, query heads). In place keeps query head h on K/V head
    h // group, so every shard's query heads find their K/V heads in the same shard."""
    kv_heads = key.shape[2]
    group = num_heads // kv_heads
    r = next(r for r in range(1, group + 1) if group % r == 0 and (kv_heads * r) % shards == 0)
    if r == 1:
        return key, value
    return jnp.repeat(key, r, axis=2), jnp.repeat(value, r, axis=2)


def pallas_attention(query, key, value, *, causal, segment_ids, scale=None, window=None):
    """Our Pallas flash attention (models/kernels/flash_attention.py); per shard under a mesh."""
    from models.kernels.flash_attention import flash_attention

    def kernel(q, k, v, segments):
        return flash_attention(q, k, v, segments, causal=causal, scale=scale, window=window)

    return per_shard(kernel, query, key, value, segment_ids)


def splash_attention(query, key, value, *, causal, segment_ids, scale=None, block_sizes=None, window=None):
    """jax's TPU splash-attention kernels (models/kernels/splash_attention.py); per shard under a
    mesh. Off TPU they run interpreted (slow, exact). Block sizes default to
    `splash.block_sizes_for` the lengths; a `splash.BlockSizes` overrides them."""
    from models.kernels import splash_attention as splash

    interpret = target_platform() != "tpu"

    def kernel(q, k, v, segments):
        return splash.splash_attention(q, k, v, segments, causal=causal, scale=scale,
                                       block_sizes=block_sizes, interpret=interpret, window=window)

    return per_shard(kernel, query, key, value, segment_ids)


def target_platform() -> str:
    """The platform attention compiles for: the ambient mesh's devices' (a TPU topology when the
    compile tool targets one from a CPU machine), else jax's default backend."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()


_LOGGED_FALLBACKS: set[str] = set()


def splash_or_fallback(query, key, kv_segment_ids) -> str:
    """'splash' when the kernels serve these shapes, else 'xla', logging each reason once."""
    from models.kernels import splash_attention as splash

    reason = splash.unsupported_reason(query.shape[1], key.shape[1],
                                       has_kv_segment_ids=kv_segment_ids is not None)
    if reason is None:
        return "splash"
    if reason not in _LOGGED_FALLBACKS:
        _LOGGED_FALLBACKS.add(reason)
        logging.warning("splash attention cannot serve this call (%s); it runs in plain XLA attention "
                        "(T x T scores in memory).", reason)
    return "xla"


# What 'auto' runs, per (platform, dtype). Every row records the evidence behind it.
#
# cpu, any dtype -> 'xla'. Measured (2-core CPU shared with other jobs, load ~9, jax 0.10.2, fp32,
# causal; fwd+bwd ms, xla vs interpreted pallas; scripts/benchmark_attention.py --lengths
# 256,1024,2048 --head-dims 64,128 --tokens 2048 --hidden 256 --dtype float32 --repeats 5):
#     T=256:  D=64 90 vs 301,    D=128 34 vs 153   -> xla 3.3-4.5x faster
#     T=1024: D=64 528 vs 156,   D=128 402 vs 107  -> pallas 3.4-3.7x faster, 2-4x less temp memory
#     T=2048: D=64 1315 vs 200,  D=128 748 vs 280  -> pallas 2.7-6.6x faster, 4-8x less temp memory
#   CPU stays on 'xla' at every length by project decision: CPU runs are tests and the quickstart
#   (T <= 256, where xla wins) and interpret mode is jax's Pallas emulator, not a supported fast
#   path. A length threshold (pallas from T >= 1024) is what these numbers would otherwise give.
# gpu, bf16/fp16 -> 'cudnn'; gpu, fp32 -> 'xla' (cuDNN flash attention has no fp32 path).
#   Measured on one H100 80GB HBM3 (jax 0.11.2, bf16, causal, 16384 tokens, 2048 hidden;
#   scripts/benchmark_attention.py through the GPU suite, docs/benchmarks.md). TFLOP/s, cudnn / pallas / xla:
#     fwd     D=64:  T=1k 263/109/18   2k 333/152/19   4k 390/188/19   8k 427/218/19
#     fwd+bwd D=64:  T=1k 203/111/25   2k 285/145/29   4k 357/177/30   8k 407/197/33
#     fwd     D=128: T=1k 320/123/32   2k 419/167/35   4k 516/226/37   8k 566/263/38
#     fwd+bwd D=128: T=1k 242/148/46   2k 351/198/55   4k 441/242/58   8k 496/272/63
#   cuDNN is fastest at every measured length and head dim (our Pallas/Triton kernel 0.4-0.6x of
#   it, jax's shipped Triton mha 0.3-0.7x, XLA 8-15x slower with T x T scores in memory), so one
#   row per dtype, no length threshold. 'auto' ran within 2% of cudnn at every shape (run-to-run).
#   fp16 was not timed; its row follows bf16 (the same cuDNN kernels).
#   Re-measured on an H200 (2026-11-26, jax 0.11.2) after tuning our kernels' launches per shape
#   (scripts/tune_attention.py): fwd+bwd TFLOP/s cudnn / pallas tuned, D=64: T=1k 217/164, 2k 292/212,
#   4k 357/248, 8k 410/272; D=128: 262/178, 357/240, 449/297, 521/335. Those per-shape timings are the
#   tuning table (models/kernels/flash_attention_tuning.json), which 'auto' consults first: it names
#   cudnn at every measured shape, so these rows stand for the shapes it lacks.
# tpu, any dtype -> 'splash': jax's own TPU flash-attention kernels (what MaxText runs on TPU),
#   for every shape they serve (self-attention, lengths a multiple of 128, no bias, no dropout);
#   other calls fall back to 'xla', logged once per reason. The evidence is memory, compiled by
#   libtpu for v5p:2x2x1 (no TPU was available: no timing is claimed; docs/benchmarks.md, "TPU
#   attention"). Temporaries per chip, a bf16 train step, xla -> splash:
#     Pythia-160M, 1 sequence per chip:  T=2048 5.37 -> 2.02 GiB, T=8192 67.40 -> 5.84 GiB,
#                                        T=32768 does not fit (libtpu: 955 G) -> 21.35 GiB
#     NeoX-20B layers (2), tensor=4, full remat: T=8192 12.19 -> 3.87 GiB, T=32768 105 G -> 7.26 GiB
AUTO_CHOICES = {
    ("cpu", "any"): "xla",
    ("gpu", "bfloat16"): "cudnn",
    ("gpu", "float16"): "cudnn",
    ("gpu", "any"): "xla",
    ("tpu", "any"): "splash",
}


def choose_implementation(query: jax.Array, *, dropout_rate: float, has_bias: bool = False, causal: bool = True,
                          cross: bool = False) -> str:
    """'auto': the implementation measured fastest at this shape (forward+backward, the tuning table of
    models/kernels/flash_attention_tuning.py) when the table has the platform, dtype, causality and head
    dim, else the per-dtype choice of AUTO_CHOICES; dropout forces 'xla' (logged once when that replaces a
    fused kernel), and a bias forces one of BIAS_IMPLEMENTATIONS ('xla' where the choice has none). 'pallas'
    is not chosen for a bias or for cross-attention's kv_segment_ids (`cross`), which it does not serve.
    The platform is `target_platform()`'s."""
    platform = target_platform()
    dtype = jnp.dtype(query.dtype).name
    choice = AUTO_CHOICES.get((platform, dtype), AUTO_CHOICES.get((platform, "any"), "xla"))
    measured = attention_tuning.fastest_implementation(platform, dtype, causal, query.shape[-1], query.shape[1])
    if measured in IMPLEMENTATIONS and not (measured == "pallas" and (has_bias or cross)):
        choice = measured
    if dropout_rate > 0.0 and choice != "xla":
        logging.log_first_n(
            logging.WARNING, "attention dropout %s runs attention in plain XLA (T x T scores in memory) "
            "instead of %r; set the model's attention_dropout_rate to 0 for the fused kernel.", 1,
            dropout_rate, choice)
        return "xla"
    return "xla" if has_bias and choice not in BIAS_IMPLEMENTATIONS else choice


def resolve_implementation(implementation: str, query: jax.Array, *, dropout_rate: float, has_bias: bool,
                           causal: bool = True, cross: bool = False) -> str:
    """The implementation a call runs: 'auto' chosen for it; one that cannot serve its dropout or bias refused."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention implementation {implementation!r} is unknown; choose one of {IMPLEMENTATIONS}."
        )
    if implementation == "auto":
        implementation = choose_implementation(query, dropout_rate=dropout_rate, has_bias=has_bias, causal=causal,
                                               cross=cross)
    if dropout_rate > 0.0 and implementation != "xla":
        raise ValueError(
            f"attention dropout {dropout_rate} needs implementation='xla' (or 'auto'); "
            f"{implementation!r} has no dropout. Set the model's attention dropout to 0 to use it."
        )
    if has_bias and implementation not in BIAS_IMPLEMENTATIONS:
        raise ValueError(
            f"an attention bias (e.g. T5's relative positions) needs implementation 'xla', 'cudnn' or 'auto'; "
            f"{implementation!r} has no bias. Set the model's attention to 'auto'."
        )
    return implementation


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, causal: bool = True,
                          segment_ids: jax.Array | None = None, kv_segment_ids: jax.Array | None = None,
                          bias: jax.Array | None = None, scale: float | None = None, implementation: str = "auto",
                          dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None,
                          block_sizes: splash.BlockSizes | None = None, window: int | None = None) -> jax.Array:
    """Multi-head attention over BTNH inputs; returns BTNH with the query's heads.

    causal: query i sees keys j <= i + (kv_len - q_len); False for encoder and cross-attention.
    window: a causal sliding window (needs causal=True; Mistral's sliding_window): query i sees only keys
    j > i + (kv_len - q_len) - window, its last `window` keys itself included; None: no window. Every
    implementation serves it.
    segment_ids [batch, q_len] / kv_segment_ids [batch, kv_len]: packed documents (0 = padding);
    kv_segment_ids default to segment_ids (equal lengths). bias: added to the fp32 logits,
    [batch or 1, heads, q_len, kv_len]. scale: multiplies q.k (default head_dim ** -0.5).
    implementation: 'auto' | 'xla' | 'cudnn' | 'pallas' | 'splash'. Attention dropout (dropout_rate
    > 0) runs only in 'xla'; 'auto' picks it then. A bias runs in 'xla' or 'cudnn' ('auto' picks one).
    'splash' (jax's TPU kernels; 'auto' on TPU) serves self-attention of lengths a multiple of 128 and
    runs other calls in 'xla', logged once. 'pallas' and 'splash' run interpreted (slow, exact) off
    their accelerators. block_sizes: a `splash.BlockSizes` overriding the ones 'splash' picks.
    """
    check_segment_ids(query, key, segment_ids, kv_segment_ids)
    window = check_window(window, causal)
    implementation = resolve_implementation(implementation, query, dropout_rate=dropout_rate,
                                            has_bias=bias is not None, causal=causal,
                                            cross=kv_segment_ids is not None)
    if implementation == "splash":
        implementation = splash_or_fallback(query, key, kv_segment_ids)
    if implementation == "splash":
        return splash_attention(query, key, value, causal=causal, segment_ids=segment_ids, scale=scale,
                                block_sizes=block_sizes, window=window)
    if implementation == "xla":
        return xla_attention(
            query, key, value, causal=causal, segment_ids=segment_ids, kv_segment_ids=kv_segment_ids,
            bias=bias, scale=scale, dropout_rate=dropout_rate, dropout_rng=dropout_rng, window=window,
        )
    if implementation == "pallas":
        if kv_segment_ids is not None:
            raise ValueError("implementation 'pallas' takes one segment_ids for queries and keys of equal "
                             "length, not kv_segment_ids (cross-attention); use 'xla', 'cudnn' or 'auto'.")
        return pallas_attention(query, key, value, causal=causal, segment_ids=segment_ids, scale=scale,
                                window=window)
    return cudnn_attention(query, key, value, causal=causal, segment_ids=segment_ids,
                           kv_segment_ids=kv_segment_ids, bias=bias, scale=scale, window=window)
