"""Pipeline parallelism over the 'stage' mesh axis, as one SPMD program (MaxText's design).

A model's scanned layer stack keeps its parameter layout, `[num_layers, ...]` with 'layers' ->
'stage'; the pipeline only views it as `[stages, repeats, layers_per_stage, ...]`: on its r-th
pass, stage s runs layers `(r * stages + s) * layers_per_stage + j`. The batch is split into
microbatches; each iteration every stage runs its layers on the microbatch it holds (a vmap over
stages with `spmd_axis_name='stage'`, so stage s computes on the devices of stage s), then the
activations move one stage on (a roll over the stage-sharded axis: a collective permute). The
last stage's output goes back to stage 0 for the next repeat (circular schedule) or is final.
A scan runs `microbatches * repeats + stages - 1` iterations, of which each stage idles for
`stages - 1`: the bubble.

`repeats=1` is GPipe; `repeats>1` is the circular schedule (each stage holds `repeats` chunks of
layers, the bubble shrinks by `repeats`, microbatches must be at least the stage count). With
repeats > 1 the stored contiguous layout is regrouped once per step (an all-to-all of each stage's
weights over 'stage', and of their gradients on the way back).

A model with several stacks (an encoder-decoder: the encoder, then the decoder, which reads the
encoder's output) pipelines each over all the stages, one after the other, with the same schedule:
every stage holds an equal share of the encoder's layers and of the decoder's, so stages carry the
same parameters, memory and work, and each stack keeps its own `[layers, ...]` parameters, so a
checkpoint moves between pipelined and plain meshes unchanged. The cost is a bubble per stack: two
per step for an encoder-decoder, each the same fraction of its stack's iterations. (CPM-Pretrain and
Megatron instead lay the encoder's layers then the decoder's along one pipeline: one bubble, but a
stage of encoder layers runs another program, on other inputs, than a stage of decoder layers, which
one SPMD program mapped over the stages cannot express; and a decoder layer, with its
cross-attention, costs more than an encoder layer, so those stages do not balance.)

Each extra argument of a stack's layers is split into microbatches with the activations when its
leading dimension is the batch's (segment ids, an encoder's output, a packed batch's position bias
[batch, heads, q, k]); one with a leading 1 is the same for every row (an unpacked batch's position
bias [1, heads, q, k]) and every microbatch reads it whole, never broadcast to the batch.

The pipeline draws dropout masks per (iteration, stage, layer), so with dropout it samples
different (equally independent) masks than the plain scan; without dropout it computes the same.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

STAGE_AXIS = "stage"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How the layer stack is pipelined: `stages` (PIPELINE_PARALLEL), `microbatches`
    (NUM_MICROBATCHES) and `repeats` (1 = GPipe, > 1 = circular)."""

    stages: int
    microbatches: int
    repeats: int = 1

    def __post_init__(self):
        for name in ("stages", "microbatches", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"pipeline {name}={getattr(self, name)} must be >= 1.")
        if self.repeats > 1 and self.microbatches < self.stages:
            raise ValueError(
                f"the circular schedule (PIPELINE_REPEATS={self.repeats}) needs NUM_MICROBATCHES >= PIPELINE_PARALLEL, "
                f"got {self.microbatches} < {self.stages}; raise NUM_MICROBATCHES or set PIPELINE_REPEATS=1 (GPipe).")

    @property
    def iterations(self) -> int:
        """Iterations of one pipelined stack (a model with several runs each in turn)."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble_fraction(self) -> float:
        """The share of stage-iterations spent idle: (stages - 1) / iterations, for every stack alike."""
        return (self.stages - 1) / self.iterations

    def describe(self, stacks: int = 1) -> str:
        """One line for the start-up log; `stacks`: how many layer stacks run through the pipeline in turn."""
        kind = "GPipe" if self.repeats == 1 else f"circular x{self.repeats}"
        each = "" if stacks == 1 else f" per stack x {stacks} stacks in turn ({stacks} bubbles per step)"
        return (f"{kind} pipeline: {self.stages} stages, {self.microbatches} microbatches, {self.iterations} "
                f"iterations{each}, bubble fraction {self.bubble_fraction:.3f}")

    def check(self, stacks: Mapping[str, int], rows: int, batch_shards: int,
              shard_macros: str = "DATA_PARALLEL x FSDP_PARALLEL") -> None:
        """Raise naming the setting to change when layers or batch rows do not divide.

        `stacks`: the layer count of every stack the pipeline splits, keyed by the model setting
        that sets it (e.g. {'num_layers': 24}); `rows` is the number of sequences the model sees at
        once (a gradient-accumulation microbatch), `batch_shards` how many ways rows are split over
        data-parallel devices (the macros of the axes that split them: `shard_macros`).
        """
        chunks = self.stages * self.repeats
        for name, num_layers in stacks.items():
            if num_layers % chunks:
                counts = str(num_layers) if len(stacks) == 1 else "every pipelined stack's layer count (" + ", ".join(
                    f"{k}={v}" for k, v in stacks.items()) + ")"
                raise ValueError(
                    f"{name}={num_layers} does not divide into PIPELINE_PARALLEL={self.stages} x PIPELINE_REPEATS="
                    f"{self.repeats} = {chunks} equal chunks; choose a stage count (and repeats) whose product "
                    f"divides {counts}.")
        if rows % self.microbatches:
            raise ValueError(
                f"{rows} rows per step (BATCH_SIZE / GRAD_ACCUM_STEPS) do not split into NUM_MICROBATCHES="
                f"{self.microbatches}; make BATCH_SIZE / GRAD_ACCUM_STEPS a multiple of NUM_MICROBATCHES.")
        if (rows // self.microbatches) % batch_shards:
            raise ValueError(
                f"a pipeline microbatch has {rows // self.microbatches} rows (BATCH_SIZE / GRAD_ACCUM_STEPS / "
                f"NUM_MICROBATCHES), which does not divide over the {batch_shards} data-parallel shards "
                f"({shard_macros}); make it a multiple of {batch_shards}.")

    def layer_stack(self, block: type[nn.Module], stack: type[nn.Module]) -> Callable[..., nn.Module]:
        """A model's layer-stack hook: given the block class and the model's scanned stack class
        (nn.scan over the block: parameters [layers, ...], called `(x, *args) -> (x, _)`), a
        constructor taking the stack's arguments and `name`, for a pipelined stack with the same
        parameters. Each extra call argument is None or an array whose leading dimension is the
        batch's (split into microbatches) or 1 (the same for every row: read whole by each)."""
        return lambda *block_args, name: Pipeline(block, stack, block_args, self, name=name)


class Pipeline(nn.Module):
    """`stack(*block_args)` run as a pipeline of `block(*block_args)` layers. Initialisation is
    the stack's own, in the same scope: identical parameters with or without the pipeline."""

    block: type[nn.Module]
    stack: type[nn.Module]
    block_args: tuple
    schedule: Schedule

    def setup(self):
        self.scanned = self.stack(*self.block_args)
        nn.share_scope(self, self.scanned)

    def __call__(self, x: jax.Array, *args: jax.Array | None) -> tuple[jax.Array, None]:
        if self.is_initializing():
            return self.scanned(x, *args)
        rng = self.make_rng("dropout") if self.has_rng("dropout") else None
        layer = self.block(*self.block_args, parent=None)
        return run(layer.apply, self.variables["params"], x, args, rng, self.schedule), None


def run(apply_layer: Callable, params: Any, x: jax.Array, args: tuple, rng: jax.Array | None,
        schedule: Schedule) -> jax.Array:
    """The pipelined stack: `apply_layer({'params': p}, x, *args, rngs=...) -> (x, _)` applied
    with each layer's slice of `params` ([length, ...] leaves), in layer order."""
    s, m, r = schedule.stages, schedule.microbatches, schedule.repeats
    weights = jax.tree.map(lambda w: stage_major(w, s, r), params)
    if r == 1:  # loop-invariant weights: the backward pass reuses them instead of saving one copy per iteration
        weights = jax.tree.map(lambda w: w[:, 0], weights)
    buffer = split_microbatches(x, m)
    per_row = tuple(a is not None and _per_row(a, x.shape[0]) for a in args)
    # a shared argument is copied to every stage once, outside the loop, so its gradient is summed
    # over the stages once per step rather than in every iteration
    fed = tuple(None if a is None else split_microbatches(a, m) if split else _stage_sharded(
        jnp.broadcast_to(a, (s, *a.shape))) for a, split in zip(args, per_row))
    stage_ids = jnp.arange(s)
    run_stage = jax.vmap(_stage_fn(apply_layer, rng is not None, r > 1), spmd_axis_name=STAGE_AXIS)

    def iteration(carry, t):
        state, buffer = carry
        first = jax.lax.dynamic_index_in_dim(buffer, t % m, keepdims=False)
        state = jnp.where((stage_ids == 0).reshape((s,) + (1,) * first.ndim), first[None], state)
        item = t - stage_ids  # the (repeat, microbatch) item each stage holds, counted in stream order
        repeat, micro = jnp.clip(item // m, 0, r - 1), item % m
        stage_args = tuple(_stage_sharded(a[micro]) if split else a for a, split in zip(fed, per_row))
        rngs = jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(rng, t), i))(stage_ids) \
            if rng is not None else None
        out = _stage_sharded(run_stage(weights, state, stage_args, repeat, rngs))
        done = t - (s - 1)  # the item leaving the last stage
        slot = jnp.maximum(done, 0) % m
        kept = jax.lax.dynamic_index_in_dim(buffer, slot, keepdims=False)
        buffer = jax.lax.dynamic_update_index_in_dim(buffer, jnp.where(done >= 0, out[-1], kept), slot, 0)
        return (_stage_sharded(jnp.roll(out, 1, axis=0)), buffer), None

    state = _stage_sharded(jnp.zeros((s,) + buffer.shape[1:], buffer.dtype))
    (_, buffer), _ = jax.lax.scan(iteration, (state, buffer), jnp.arange(schedule.iterations))
    return merge_microbatches(buffer)


def _per_row(arg: jax.Array, rows: int) -> bool:
    """Whether a layer's extra argument holds one entry per batch row (split into microbatches) or
    one for all rows (leading dimension 1: every microbatch reads it whole)."""
    if arg.shape[0] not in (rows, 1):
        raise ValueError(f"a pipelined layer's argument of shape {arg.shape} leads with neither the batch's "
                         f"{rows} rows nor 1 (shared by every row); give it one of those leading dimensions.")
    return arg.shape[0] == rows


def _stage_fn(apply_layer: Callable, with_rng: bool, select_repeat: bool) -> Callable:
    """One stage's work in one iteration: its (current repeat's) layers, in order, on one microbatch."""

    def stage(weights, x, args, repeat, rng):
        layers = jax.tree.map(lambda w: jax.lax.dynamic_index_in_dim(w, repeat, keepdims=False), weights) \
            if select_repeat else weights

        def one_layer(x, inputs):
            params, i = inputs
            rngs = {"dropout": jax.random.fold_in(rng, i)} if with_rng else None
            y, _ = apply_layer({"params": params}, x, *args, rngs=rngs)
            return y, None

        count = jax.tree.leaves(layers)[0].shape[0]
        return jax.lax.scan(one_layer, x, (layers, jnp.arange(count)))[0]

    return stage


def stage_major(w: jax.Array, stages: int, repeats: int) -> jax.Array:
    """[layers, ...] -> [stages, repeats, layers_per_stage, ...] (stage s, repeat r holds layers
    (r * stages + s) * layers_per_stage ...); free for repeats=1, an all-to-all otherwise."""
    grouped = w.reshape(repeats, stages, w.shape[0] // (stages * repeats), *w.shape[1:])
    return _stage_sharded(jnp.swapaxes(grouped, 0, 1), unsharded=2)


def split_microbatches(x: jax.Array, count: int, setting: str = "NUM_MICROBATCHES") -> jax.Array:
    """[B, ...] -> [count, B/count, ...]; microbatch i holds rows i, i+count, ..., so every
    microbatch keeps the batch's spread over the data-parallel devices. `setting` names the macro
    that asked for `count`, for the error message (pipeline or gradient-accumulation microbatches)."""
    if x.shape[0] % count:
        raise ValueError(f"a batch of {x.shape[0]} rows does not split into {setting}={count}; "
                         f"make the rows per step a multiple of {setting}.")
    return jnp.swapaxes(x.reshape(x.shape[0] // count, count, *x.shape[1:]), 0, 1)


def merge_microbatches(x: jax.Array) -> jax.Array:
    """The inverse of split_microbatches."""
    return jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _stage_sharded(x: jax.Array, unsharded: int = 0) -> jax.Array:
    """Pin dim 0 to 'stage' and the next `unsharded` dims to nothing, leaving the rest to the
    model's own constraints; a no-op outside a mesh with a 'stage' axis."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or STAGE_AXIS not in mesh.axis_names:
        return x
    spec = P(STAGE_AXIS, *[None] * unsharded, *[P.UNCONSTRAINED] * (x.ndim - 1 - unsharded))
    return jax.lax.with_sharding_constraint(x, spec)
