"""Train state and the pure step functions: loss, gradient accumulation, loss scaling.

`train_step(state, batch)` and `eval_step(params, batch)` are built by `make_train_step` /
`make_eval_step` and jitted by the caller with in/out shardings and donation. Batches are
dicts of [batch, length] arrays: inputs, targets, weights and, for packed rows, segment_ids
and positions.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax

from models.kernels.cross_entropy import chunked_cross_entropy

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
    """Dynamic loss scaling for float16 compute, with DeepSpeed's fp16 knobs.

    The scale starts at 2**initial_scale_power. A step whose gradients are not finite is
    skipped; after `hysteresis` such steps in a row the scale halves (not below min_scale).
    After `window` finite steps since the last overflow it doubles.
    """

    initial_scale_power: int = 16
    window: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0


@flax.struct.dataclass
class LossScale:
    scale: jax.Array
    good_steps: jax.Array
    hysteresis_left: jax.Array

    @classmethod
    def create(cls, config: LossScaleConfig) -> "LossScale":
        return cls(jnp.asarray(2.0 ** config.initial_scale_power, jnp.float32),
                   jnp.zeros((), jnp.int32), jnp.asarray(config.hysteresis, jnp.int32))

    def update(self, finite: jax.Array, config: LossScaleConfig) -> "LossScale":
        """The next scale after a step whose gradients were (not) finite."""
        backoff = self.hysteresis_left <= 1
        on_overflow = LossScale(
            scale=jnp.where(backoff, jnp.maximum(self.scale / 2, config.min_scale), self.scale),
            good_steps=jnp.zeros_like(self.good_steps),
            hysteresis_left=jnp.where(backoff, config.hysteresis, self.hysteresis_left - 1),
        )
        good = self.good_steps + 1
        grow = good >= config.window
        on_finite = LossScale(
            scale=jnp.where(grow, self.scale * 2, self.scale),
            good_steps=jnp.where(grow, 0, good),
            hysteresis_left=jnp.asarray(config.hysteresis, jnp.int32),
        )
        return jax.tree.map(lambda a, b: jnp.where(finite, a, b), on_finite, on_overflow)


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    loss_scale: LossScale | None = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """What the step does besides the optimizer update."""

    grad_accum_steps: int = 1
    z_loss: float = 0.0
    loss_scale: LossScaleConfig | None = None  # set for float16 compute
    cross_entropy: str = "xla"  # 'xla': from full logits; 'chunked': never materialises them
    offload_optimizer_state: bool = False  # optimizer state lives in host memory, visits the device to update

    def __post_init__(self):
        if self.cross_entropy not in CROSS_ENTROPY:
            raise ValueError(f"cross_entropy={self.cross_entropy!r}: choose one of {CROSS_ENTROPY}.")


CROSS_ENTROPY = ("xla", "chunked")


def init_train_state(model: nn.Module, tx: optax.GradientTransformation, rng: jax.Array,
                     sample_tokens: jax.Array, loss_scale: LossScaleConfig | None) -> TrainState:
    """A fresh state whose params and optimizer moments keep their logical-axis boxes."""
    params_rng, dropout_rng = jax.random.split(rng)
    params = model.init(params_rng, sample_tokens)["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params), rng=dropout_rng,
        loss_scale=LossScale.create(loss_scale) if loss_scale else None,
    )


def cross_entropy_sums(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                       z_loss: float) -> tuple[jax.Array, jax.Array]:
    """(Σ weights·nll, z_loss·Σ weights·logsumexp²) in fp32; padded vocab ids are already masked."""
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = (log_z - target_logit) * weights
    return nll.sum(), z_loss * (jnp.square(log_z) * weights).sum()


def model_inputs(batch: Batch) -> dict[str, jax.Array]:
    return {k: batch[k] for k in ("positions", "segment_ids") if k in batch}


def loss_sums(model: nn.Module, params: Any, batch: Batch, *, z_loss: float, dropout_rng: jax.Array | None,
              cross_entropy: str = "xla") -> tuple[jax.Array, jax.Array, jax.Array]:
    """(Σ nll, Σ z-loss, Σ weights) of one batch; dropout is on when a dropout_rng is given."""
    outputs = model.apply({"params": params}, batch["inputs"], **model_inputs(batch),
                          deterministic=dropout_rng is None, return_hidden=cross_entropy == "chunked",
                          rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
    weights = batch["weights"].astype(jnp.float32)
    if cross_entropy == "chunked":
        hidden, embedding = outputs
        nll, z = chunked_cross_entropy(hidden, embedding, batch["targets"], weights,
                                       vocab_size=model.config.vocab_size, z_loss=z_loss)
    else:
        nll, z = cross_entropy_sums(outputs, batch["targets"], weights, z_loss)
    return nll, z, weights.sum()


def split_microbatches(batch: Batch, count: int) -> Batch:
    """[B, ...] -> [count, B/count, ...], microbatch i = rows i, i+count, ... so that every
    microbatch keeps the batch's spread over the data-parallel devices."""
    def split(x):
        if x.shape[0] % count:
            raise ValueError(f"batch of {x.shape[0]} rows does not split into {count} microbatches; "
                             "make BATCH_SIZE a multiple of GRAD_ACCUM_STEPS.")
        return jnp.swapaxes(x.reshape(x.shape[0] // count, count, *x.shape[1:]), 0, 1)
    return jax.tree.map(split, batch)


def accumulate_gradients(grad_fn: Callable, params: Any, batch: Batch, rng: jax.Array, count: int):
    """Sum (grads, aux) of grad_fn over `count` microbatches inside one scan."""
    if count == 1:
        return grad_fn(params, batch, rng)
    micro = split_microbatches(batch, count)

    def body(carry, xs):
        micro_batch, i = xs
        grads, aux = grad_fn(params, micro_batch, jax.random.fold_in(rng, i))
        return jax.tree.map(jnp.add, carry, (grads, aux)), None

    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro), rng))
    (grads, aux), _ = jax.lax.scan(body, zeros, (micro, jnp.arange(count)))
    return grads, aux


def leaf_finite(tree: Any) -> jax.Array:
    """bool[number of leaves]: whether each leaf (in jax.tree.leaves order) is entirely finite."""
    return jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)])


def make_train_step(model: nn.Module, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    config: StepConfig) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """The pure train step: loss -> grads (accumulated) -> (unscaled) -> optax update. A step whose
    loss or gradients are not finite leaves params and optimizer state unchanged (metrics 'skipped'
    and, per parameter leaf, 'grad_finite' say so)."""

    def grad_fn(params, batch, rng, scale):
        def scaled_loss(p):
            nll, z, w = loss_sums(model, p, batch, z_loss=config.z_loss, dropout_rng=rng,
                                  cross_entropy=config.cross_entropy)
            return (nll + z) * scale, (nll, z, w)
        return jax.grad(scaled_loss, has_aux=True)(params)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        scale = state.loss_scale.scale if state.loss_scale is not None else jnp.float32(1.0)
        rng = jax.random.fold_in(state.rng, state.step)
        grads, (nll, z, weight) = accumulate_gradients(
            functools.partial(grad_fn, scale=scale), state.params, batch, rng, config.grad_accum_steps)
        weight = jnp.maximum(weight, 1.0)
        grads = jax.tree.map(lambda g: g / (weight * scale), grads)
        grad_finite = leaf_finite(grads)
        finite = grad_finite.all() & jnp.isfinite(nll)
        old_opt_state = state.opt_state
        if config.offload_optimizer_state:
            old_opt_state = jax.device_put(old_opt_state, jax.memory.Space.Device)
        updates, opt_state = tx.update(grads, old_opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        skip = ~finite  # never apply a non-finite update: 'skip' goes on, 'stop' stops with a clean state
        keep_old = functools.partial(jax.tree.map, lambda old, new: jnp.where(skip, old, new))
        new_state = state.replace(
            step=state.step + 1,
            params=keep_old(state.params, params),
            opt_state=keep_old(old_opt_state, opt_state),
            loss_scale=state.loss_scale.update(finite, config.loss_scale) if state.loss_scale is not None else None,
        )
        metrics = {
            "loss": nll / weight,
            "z_loss": z / weight,
            "grad_norm": optax.tree.norm(grads),
            "learning_rate": schedule(state.step),
            "tokens": weight,
            "skipped": skip.astype(jnp.int32),
            "grad_finite": grad_finite,
        }
        if state.loss_scale is not None:
            metrics["loss_scale"] = state.loss_scale.scale
        return new_state, metrics

    return train_step


def make_eval_step(model: nn.Module, cross_entropy: str = "xla") -> Callable[[Any, Batch], Metrics]:
    """Σ nll and Σ weights of one batch, deterministic (no dropout)."""

    def eval_step(params: Any, batch: Batch) -> Metrics:
        nll, _, weight = loss_sums(model, params, batch, z_loss=0.0, dropout_rng=None, cross_entropy=cross_entropy)
        return {"nll_sum": nll, "weight_sum": weight}

    return eval_step
