"""numpy references and helpers shared by the layer library's tests (float32, rtol/atol 1e-5 unless stated)."""
import math

import flax.linen as nn
import jax
import numpy as np

TOL = dict(rtol=1e-5, atol=1e-5)


def init(module, seed, *args, **kwargs):
    """The module's parameters only (module.init's default would also create FP8 state, turning FP8 on)."""
    return module.init(jax.random.PRNGKey(seed), *args, mutable=["params"], **kwargs)


def boxed(variables):
    """{name: LogicallyPartitioned} of a module's parameters, checked to be boxed with logical names."""
    params = variables["params"]
    assert all(isinstance(p, nn.LogicallyPartitioned) for p in params.values()), params
    return params


def values(variables):
    """{name: numpy array} of a module's (boxed) parameters."""
    return {k: np.asarray(v.value) for k, v in boxed(variables).items()}


def perturbed(variables, seed):
    """The parameters plus noise (biases start at zero: the forward checks then see their use)."""
    return jax.tree.map(lambda p: p + 0.1 * jax.random.normal(jax.random.PRNGKey(seed), p.shape), variables)


def softmax_attention(q, k, v, mask, scale, bias=None):
    """q [b, t, h, d], k/v [b, s, h or fewer, d] (query heads grouped over them), mask [b or 1, h or 1, t, s]
    -> [b, t, h, d]."""
    group = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    logits = np.einsum("bthd,bshd->bhts", q, k) * scale + (0.0 if bias is None else bias)
    logits = np.where(mask, logits, -np.inf)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    return np.einsum("bhts,bshd->bthd", weights / weights.sum(-1, keepdims=True), v)


def rotary_reference(x, positions, rotary_dim, base):
    """GPT-NeoX's rotate-half RoPE (transformers' apply_rotary_pos_emb) in numpy."""
    inv_freq = 1.0 / base ** (np.arange(0, rotary_dim, 2) / rotary_dim)
    angles = positions[..., None] * inv_freq
    angles = np.concatenate([angles, angles], -1)[:, :, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = np.concatenate([-rot[..., half:], rot[..., :half]], -1)
    return np.concatenate([rot * np.cos(angles) + rotated * np.sin(angles), rest], -1)


def t5_bucket_reference(relative_position, bidirectional, num_buckets, max_distance):
    """transformers' T5Attention._relative_position_bucket, in numpy."""
    buckets = np.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).astype(np.int64) * num_buckets
        relative_position = np.abs(relative_position)
    else:
        relative_position = -np.minimum(relative_position, 0)
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    large = max_exact + (np.log(np.maximum(relative_position, 1) / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(is_small, relative_position, large)


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def param_paths(params) -> set[str]:
    """'attn/query_kernel', ...: the paths of a parameter tree's leaves."""
    return {"/".join(str(k.key) for k in path) for path, _ in jax.tree_util.tree_leaves_with_path(params)}


def block_params(block, x, positions, seed=0):
    """A decoder block's parameters, unboxed and perturbed (so that zero-initialised biases show), initialised
    on the residual stream x [batch, length, embed] at positions [batch, length] without segments."""
    return perturbed(nn.meta.unbox(init(block, seed, x, None, positions)["params"]), seed + 1)
