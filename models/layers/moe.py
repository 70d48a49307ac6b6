"""The mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE): a router picks each token's top-k experts, each
expert is a gated MLP, and the token's output is the experts' outputs weighted by the router's probabilities;
Qwen2-MoE adds a shared expert behind a sigmoid gate that every token goes through.

Two ways to send tokens to their experts:
  - dropless (capacity_factor None, the default): the (token, expert) assignments sorted by expert and run
    through grouped matrix multiplies (`jax.lax.ragged_dot`), every assignment computed, as MegaBlocks,
    Megatron-Core's grouped GEMM and MaxText's sparse matmul do;
    Under a mesh each device groups its own rows' tokens (jax.shard_map; `dropless`);
  - with a capacity (capacity_factor c): in each row (sequence: GShard's group) each expert takes at most
    ceil(c · length · k / experts) assignments, first come first served in token order, into a fixed
    [experts, capacity, embed] buffer (batched matmuls of fixed shape); assignments past an expert's capacity
    are dropped (the token keeps its residual and its other experts), as GShard / Switch Transformer and
    MaxText's capacity mode do. Rows are independent, so no device ever holds the whole batch's tokens.

Parameters (torch's per-expert Linear weights, stacked on a leading 'expert' axis):

    router_kernel [embed, experts]
    gate_kernel, fc_kernel [experts, embed, expert_mlp]   proj_kernel [experts, expert_mlp, embed]
    shared_expert/{gate,fc,proj}_kernel, shared_gate_kernel [embed, 1]   (with a shared expert)

The router's statistics of each call (tokens per expert, router probabilities, log-partition) are sown into
the ROUTER_STATS collection; `router_losses` turns a model's sown statistics into the load-balancing loss of
transformers' `load_balancing_loss_func` (all layers' tokens together), the router z-loss and each expert's
share of the assignments.
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from models.kernels.sharding import active_mesh, mesh_axes
from models.layers.dense import BATCH_LENGTH_EMBED, normal_param
from models.layers.mlp import ACTIVATIONS, MLP

ROUTER_STATS = "router_stats"
"""The variable collection the MoE layers sow their routing statistics into (apply with it mutable)."""

EXPERT_AXES = ("expert", "embed", "mlp")
EXPERT_OUT_AXES = ("expert", "mlp", "embed")


class MoE(nn.Module):
    """x [batch, length, embed] -> the weighted sum of each token's top-k experts (gated MLPs with
    `activation`), plus a gated shared expert when shared_expert_mlp_dim is set. `valid` [batch, length]
    marks real tokens: padding neither takes an expert's capacity nor counts in the router statistics."""

    num_experts: int
    top_k: int
    expert_mlp_dim: int
    init_std: float
    out_init_std: float
    activation: str = "silu"
    normalize_top_k: bool = True
    """Divide the k chosen probabilities by their sum (Mixtral, Qwen3-MoE) or keep them (Qwen2-MoE)."""
    shared_expert_mlp_dim: int | None = None
    capacity_factor: float | None = None
    """None: dropless. c: each row (sequence) gives each expert at most ceil(c · length · k / experts) places."""
    dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    def kernel(self, name: str, shape: tuple[int, ...], axes: tuple[str, ...], std: float) -> jax.Array:
        return normal_param(self, name, std, shape, axes, self.param_dtype).astype(self.dtype)

    @nn.compact
    def __call__(self, x: jax.Array, valid: jax.Array | None = None) -> jax.Array:
        embed = x.shape[-1]
        valid = jnp.ones(x.shape[:2], bool) if valid is None else valid.astype(bool)
        router = self.kernel("router_kernel", (embed, self.num_experts), ("embed", None), self.init_std)
        logits = jnp.einsum("btd,de->bte", x, router).astype(jnp.float32)
        probs = jax.nn.softmax(logits, axis=-1)
        weights, experts = jax.lax.top_k(probs, self.top_k)  # [batch, length, k]
        if self.normalize_top_k:
            weights = weights / weights.sum(axis=-1, keepdims=True)
        self.sow_router_stats(logits, probs, experts, valid)
        kernels = self.expert_kernels(embed)
        weights = weights.astype(self.dtype)
        if self.capacity_factor is None:
            out = dropless(x, experts, weights, kernels, self.activation)
        else:
            out = jax.vmap(lambda *row: with_capacity(*row, kernels, self.activation, self.capacity_factor))(
                x, experts, weights, valid)
        if self.shared_expert_mlp_dim:
            out = out + self.shared_expert(x)
        return nn.with_logical_constraint(out, BATCH_LENGTH_EMBED)

    def expert_kernels(self, embed: int) -> tuple[jax.Array, jax.Array, jax.Array]:
        shape, out_shape = (self.num_experts, embed, self.expert_mlp_dim), (self.num_experts, self.expert_mlp_dim, embed)
        return (self.kernel("gate_kernel", shape, EXPERT_AXES, self.init_std),
                self.kernel("fc_kernel", shape, EXPERT_AXES, self.init_std),
                self.kernel("proj_kernel", out_shape, EXPERT_OUT_AXES, self.out_init_std))

    def sow_router_stats(self, logits: jax.Array, probs: jax.Array, experts: jax.Array, valid: jax.Array) -> None:
        mask = valid.astype(jnp.float32)[..., None]
        chosen = jax.nn.one_hot(experts, self.num_experts, dtype=jnp.float32).sum(axis=-2)  # [batch, length, experts]
        self.sow(ROUTER_STATS, "stats", {
            "assignments": (chosen * mask).sum(axis=(0, 1)),
            "probability": (probs * mask).sum(axis=(0, 1)),
            "tokens": mask.sum(),
            "log_partition_squared": (jnp.square(jax.nn.logsumexp(logits, axis=-1)) * mask[..., 0]).sum(),
        })

    def shared_expert(self, x: jax.Array) -> jax.Array:
        """Qwen2-MoE's shared expert: a gated MLP every token takes, times sigmoid(shared_gate x)."""
        mlp = MLP(self.shared_expert_mlp_dim, self.activation, self.init_std, self.out_init_std, gated=True,
                  dtype=self.dtype, param_dtype=self.param_dtype, name="shared_expert")
        gate = self.kernel("shared_gate_kernel", (x.shape[-1], 1), ("embed", None), self.init_std)
        return jax.nn.sigmoid(x @ gate) * mlp(x)


def expert_mlp(rows: jax.Array, matmul, kernels, activation: str) -> jax.Array:
    gate, fc, proj = kernels
    hidden = ACTIVATIONS[activation](matmul(rows, gate)) * matmul(rows, fc)
    return matmul(checkpoint_name(hidden, "mlp_hidden"), proj)


def grouped_experts(tokens: jax.Array, experts: jax.Array, weights: jax.Array, kernels, activation: str,
                    first_expert: jax.Array | int = 0) -> jax.Array:
    """tokens [n, embed] through the experts `kernels` hold (experts first_expert ... first_expert + E - 1 of
    the model's), each assignment (experts, weights [n, k]) to one of them grouped by expert and run by
    ragged_dot; assignments to other experts add nothing."""
    local_experts, top_k = kernels[0].shape[0], experts.shape[-1]
    local = experts.reshape(-1) - first_expert
    here = (local >= 0) & (local < local_experts)
    group = jnp.where(here, local, local_experts)  # elsewhere: after every group, never computed
    order = jnp.argsort(group, stable=True)
    token_of = order // top_k
    sizes = jnp.bincount(group, length=local_experts + 1)[:local_experts].astype(jnp.int32)
    outputs = expert_mlp(tokens[token_of], lambda rows, kernel: jax.lax.ragged_dot(rows, kernel, sizes), kernels,
                         activation)
    outputs = outputs * (weights.reshape(-1) * here)[order][:, None]
    return jnp.zeros_like(tokens).at[token_of].add(outputs)


def dropless(x: jax.Array, experts: jax.Array, weights: jax.Array, kernels, activation: str) -> jax.Array:
    """Every assignment, by grouped matmuls. Under a mesh, per shard (jax.shard_map): each device groups its
    own rows' tokens (no device sorts the whole batch); with the experts split over mesh axes the rows of
    those axes are gathered, each device runs its experts on them and the outputs are summed back to their
    rows (Megatron's all-gather dispatcher); an expert width split over 'tensor' is summed over it."""
    batch, length, embed = x.shape

    def run(x, experts, weights, gate, fc, proj, gather=(), reduce=(), first=0):
        tokens = x.reshape(-1, embed)
        experts, weights = experts.reshape(-1, experts.shape[-1]), weights.reshape(-1, weights.shape[-1])
        if gather:
            tokens, experts, weights = (jax.lax.all_gather(a, gather, tiled=True) for a in (tokens, experts, weights))
        out = grouped_experts(tokens, experts, weights, (gate, fc, proj), activation, first)
        if reduce:
            out = jax.lax.psum(out, reduce)
        if gather:
            out = jax.lax.psum_scatter(out, gather, scatter_dimension=0, tiled=True)
        return out.reshape(x.shape)

    mesh = active_mesh()
    if mesh is None:
        return run(x, experts, weights, *kernels)
    rows = mesh_axes("activation_batch", mesh, batch)
    split = mesh_axes("expert", mesh, kernels[0].shape[0])
    width = tuple(a for a in mesh_axes("mlp", mesh, kernels[0].shape[-1]) if a not in rows + split)
    gather = tuple(a for a in split if a in rows)
    reduce = width + tuple(a for a in split if a not in rows)

    def per_shard(x, experts, weights, gate, fc, proj):
        first = jax.lax.axis_index(split) * gate.shape[0] if split else 0
        return run(x, experts, weights, gate, fc, proj, gather, reduce, first)

    by_row, kernel = P(rows or None, None, None), P(split or None, None, width or None)
    return jax.shard_map(per_shard, mesh=mesh, in_specs=(by_row, by_row, by_row, kernel, kernel,
                                                        P(split or None, width or None, None)),
                         out_specs=by_row, axis_names=frozenset(mesh.auto_axes), check_vma=False)(
        x, experts, weights, *kernels)


def with_capacity(x: jax.Array, experts: jax.Array, weights: jax.Array, valid: jax.Array, kernels, activation: str,
                  capacity_factor: float) -> jax.Array:
    """One row (x [length, embed], experts and weights [length, k], valid [length]): each expert's first
    ceil(capacity_factor · length · k / experts) assignments in token order, in an [experts, capacity, embed]
    buffer (batched matmuls of a fixed shape), the rest dropped."""
    length, embed = x.shape
    num_experts, top_k = kernels[0].shape[0], experts.shape[-1]
    capacity = max(1, math.ceil(capacity_factor * length * top_k / num_experts))
    flat_experts = jnp.where(valid[:, None], experts, num_experts).reshape(-1)  # padding: no expert
    chosen = jax.nn.one_hot(flat_experts, num_experts, dtype=jnp.int32)  # [length * k, experts]
    rank = ((jnp.cumsum(chosen, axis=0) - 1) * chosen).sum(axis=-1)  # place in its expert's queue
    kept = (flat_experts < num_experts) & (rank < capacity)
    slot = jnp.where(kept, flat_experts * capacity + rank, num_experts * capacity)  # dropped: a spare row
    buffer = jnp.zeros((num_experts * capacity + 1, embed), x.dtype).at[slot].set(jnp.repeat(x, top_k, axis=0))
    buffer = buffer[:-1].reshape(num_experts, capacity, embed)
    outputs = expert_mlp(buffer, lambda rows, kernel: jnp.einsum("ecd,edf->ecf", rows, kernel), kernels, activation)
    outputs = jnp.concatenate([outputs.reshape(-1, embed), jnp.zeros((1, embed), outputs.dtype)])[slot]
    outputs = outputs * (weights.reshape(-1) * kept)[:, None]
    return outputs.reshape(length, top_k, embed).sum(axis=1)


def router_losses(stats: Any) -> dict[str, jax.Array]:
    """A model's sown ROUTER_STATS (every MoE layer's, scanned or not) -> {} when it has none, else
    'load_balancing_loss' (transformers' load_balancing_loss_func over all layers' tokens together:
    experts · Σ_e share of assignments_e · mean probability_e, where both means run over every layer's real
    tokens), 'router_z_loss' (the mean over layers and tokens of logsumexp(router logits)², ST-MoE's) and
    'expert_share' [experts] (each expert's fraction of the assignments, over all layers)."""
    leaves = [leaf for leaf in jax.tree.leaves(stats, is_leaf=lambda x: isinstance(x, dict) and "tokens" in x)
              if isinstance(leaf, dict)]
    if not leaves:
        return {}
    def total(name: str) -> jax.Array:  # over layers (a scanned stack's leading axis) and stacks
        per_layer = [leaf[name].reshape(-1, leaf[name].shape[-1]) if name in VECTORS else leaf[name].reshape(-1, 1)
                     for leaf in leaves]
        summed = jnp.concatenate(per_layer).sum(axis=0)
        return summed if name in VECTORS else summed[0]

    tokens = jnp.maximum(total("tokens"), 1.0)
    assignments, probability = total("assignments"), total("probability")
    experts = assignments.shape[-1]
    return {
        "load_balancing_loss": experts * (assignments / tokens * probability / tokens).sum(),
        "router_z_loss": total("log_partition_squared") / tokens,
        "expert_share": assignments / jnp.maximum(assignments.sum(), 1.0),
    }


VECTORS = ("assignments", "probability")
"""The per-expert statistics (their last axis is the experts'; the scalars have none)."""
