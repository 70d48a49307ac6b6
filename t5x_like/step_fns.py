"""Train state and the pure step functions: gradient accumulation, loss scaling, the update.

`train_step(state, batch)` and `eval_step(params, batch)` are built by `make_train_step` /
`make_eval_step` over a LanguageModel (t5x_like/lm/: it owns the batch's features and the loss)
and jitted by the Partitioner with in/out shardings and donation (t5x_like/experiment.py).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from models.layers import FP8_STATE
from partitioning.pipeline import split_microbatches
from t5x_like import checks, optim
from t5x_like.lm import LanguageModel, Lengths, check_cross_entropy

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossScaleConfig:
    """Dynamic loss scaling for float16 compute, with DeepSpeed's fp16 knobs and meaning: the scale
    multiplies the step's mean loss (not its sum over tokens), so a DeepSpeed fp16 section
    (initial_scale_power, loss_scale_window, hysteresis, min_loss_scale) behaves as it does there.

    The scale starts at 2**initial_scale_power. A step whose gradients are not finite is
    skipped; the first `hysteresis` - 1 such steps keep the scale, every later one halves it (not below
    min_scale), until `window` finite steps in a row double it and restore the hysteresis. `static_scale` > 0 is
    DeepSpeed's fixed `loss_scale` (Megatron's --loss-scale): the scale is that and never changes (a step whose
    gradients are not finite is still skipped); 0 = dynamic.
    """

    initial_scale_power: int = 16
    window: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0
    static_scale: float = 0.0

    def __post_init__(self):
        checks.finite_float("trainer.LossScaleConfig.static_scale", self.static_scale, minimum=0.0,
                              fix="0 = dynamic loss scaling")


@flax.struct.dataclass
class LossScale:
    scale: jax.Array
    good_steps: jax.Array
    hysteresis_left: jax.Array

    @classmethod
    def create(cls, config: LossScaleConfig) -> "LossScale":
        start = config.static_scale or 2.0 ** config.initial_scale_power
        return cls(jnp.asarray(start, jnp.float32),
                   jnp.zeros((), jnp.int32), jnp.asarray(config.hysteresis, jnp.int32))

    def update(self, finite: jax.Array, config: LossScaleConfig) -> "LossScale":
        """The next scale after a step whose gradients were (not) finite (a static scale stays), as Megatron's
        DynamicGradScaler and DeepSpeed's DynamicLossScaler count: each overflow uses up one of `hysteresis`, and
        once they are used up every overflow halves the scale; they come back only when the scale grows (after
        `window` finite steps in a row), so Megatron's 2**32 start backs off one halving per step."""
        if config.static_scale:
            return self
        backoff = self.hysteresis_left <= 1
        on_overflow = LossScale(
            scale=jnp.where(backoff, jnp.maximum(self.scale / 2, config.min_scale), self.scale),
            good_steps=jnp.zeros_like(self.good_steps),
            hysteresis_left=jnp.maximum(self.hysteresis_left - 1, 0),
        )
        good = self.good_steps + 1
        grow = good >= config.window
        on_finite = LossScale(
            scale=jnp.where(grow, self.scale * 2, self.scale),
            good_steps=jnp.where(grow, 0, good),
            hysteresis_left=jnp.where(grow, config.hysteresis, self.hysteresis_left),
        )
        return jax.tree.map(lambda a, b: jnp.where(finite, a, b), on_finite, on_overflow)


@flax.struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    rng: jax.Array
    loss_scale: LossScale | None = None
    fp8_state: Any = None
    """The FP8 matmuls' scales and amax histories (model_config.matmul_dtype == 'fp8'; lm.init_variables):
    not parameters, each step overwrites them with their "gradient" (their next value)."""


@dataclasses.dataclass(frozen=True)
class StepConfig:
    """What the step does besides the optimizer update."""

    grad_accum_steps: int = 1
    z_loss: float = 0.0
    loss_scale: LossScaleConfig | None = None  # set for float16 compute
    cross_entropy: str = "chunked"  # t5x_like.lm.CROSS_ENTROPY
    loss_chunk_size: int = 256  # sequence positions per step of the chunked cross-entropy
    offload_optimizer_state: bool = False  # optimizer state lives in host memory, visits the device to update

    def __post_init__(self):
        check_cross_entropy(self.cross_entropy)


def init_train_state(lm: LanguageModel, tx: optax.GradientTransformation, rng: jax.Array,
                     lengths: Lengths, loss_scale: LossScaleConfig | None) -> TrainState:
    """A fresh state whose params and optimizer moments keep their logical-axis boxes."""
    params_rng, dropout_rng = jax.random.split(rng)
    variables = lm.init_variables(params_rng, lengths)
    params = variables["params"]
    return TrainState(
        step=jnp.zeros((), jnp.int32), params=params, opt_state=optim.init_state(tx, params), rng=dropout_rng,
        loss_scale=LossScale.create(loss_scale) if loss_scale else None, fp8_state=variables.get(FP8_STATE),
    )


def add_trees(a: Any, b: Any) -> Any:
    return jax.tree.map(jnp.add, a, b)


def sum_over_microbatches(fn: Callable[[Batch, jax.Array], Any], batch: Batch, count: int,
                          combine: Callable[[Any, Any], Any] = add_trees) -> Any:
    """Σ fn(microbatch, index) over `count` microbatches (GRAD_ACCUM_STEPS) inside one scan (`combine`
    instead of the sum, starting from zeros)."""
    if count == 1:
        return fn(batch, jnp.zeros((), jnp.int32))
    micro = jax.tree.map(lambda x: split_microbatches(x, count, "GRAD_ACCUM_STEPS"), batch)

    def body(carry, xs):
        return combine(carry, fn(*xs)), None

    first = jax.tree.map(lambda x: x[0], micro)
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(fn, first, jnp.zeros((), jnp.int32)))
    total, _ = jax.lax.scan(body, zeros, (micro, jnp.arange(count)))
    return total


def accumulate_gradients(grad_fn: Callable, params: Any, batch: Batch, rng: jax.Array, count: int):
    """(grads, aux, fp8_state) of grad_fn over `count` microbatches, each with its own dropout key: grads
    and aux summed, the next FP8 state (scales, amax histories: non-negative) their elementwise maximum.
    Every microbatch starts from the same state, so its scales agree and the newest amax is the whole
    batch's: the state after accumulation is the one a single big batch gives."""
    if count == 1:  # the step's own key, not fold_in(key, 0): runs without accumulation keep their dropout
        return grad_fn(params, batch, rng)

    def combine(a, b):
        return add_trees(a[:2], b[:2]) + (jax.tree.map(jnp.maximum, a[2], b[2]),)

    return sum_over_microbatches(lambda micro, i: grad_fn(params, micro, jax.random.fold_in(rng, i)), batch, count,
                                 combine)


def leaf_finite(tree: Any) -> jax.Array:
    """bool[number of leaves]: whether each leaf (in jax.tree.leaves order) is entirely finite."""
    return jnp.stack([jnp.isfinite(x).all() for x in jax.tree.leaves(tree)])


def auxiliary_loss(lm: LanguageModel, auxiliary: dict[str, jax.Array]) -> jax.Array:
    """The layers' auxiliary losses (a mixture of experts' router losses), each times its weight in the
    training loss (the model config's loss_terms)."""
    if not auxiliary:
        return jnp.zeros((), jnp.float32)
    return sum(weight * auxiliary[name] for name, weight in lm.config.loss_terms().items() if name in auxiliary)


def make_train_step(lm: LanguageModel, tx: optax.GradientTransformation, schedule: optax.Schedule,
                    config: StepConfig) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """The pure train step: loss -> grads (accumulated) -> (unscaled) -> optax update. A step whose
    loss or gradients are not finite, or whose update would leave a parameter or an optimizer
    statistic non-finite (an overflow of the update itself), leaves params, optimizer state and FP8 state
    unchanged (metrics 'skipped', 'update_finite' and, per parameter leaf, 'grad_finite' say so).
    'learning_rate' is the rate this step's update used: optax's count, which skipped steps do not
    advance, not the step number."""

    def grad_fn(params, batch, rng, *, fp8_state, scale):
        def scaled_loss(p, f):
            sums = lm.loss_sums(p, batch, rng, z_loss=config.z_loss, cross_entropy=config.cross_entropy,
                                loss_chunk_size=config.loss_chunk_size, fp8_state=f)
            return (sums.nll + sums.z_loss + auxiliary_loss(lm, sums.auxiliary)) * scale, sums
        (grads, fp8_next), aux = jax.grad(scaled_loss, argnums=(0, 1), has_aux=True)(params, fp8_state)
        return grads, aux, fp8_next  # an FP8 state's "gradient" is its next value (flax's fp8_ops)

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        scale = state.loss_scale.scale if state.loss_scale is not None else jnp.float32(1.0)
        rng = jax.random.fold_in(state.rng, state.step)
        # Differentiate the mean loss times the scale, as DeepSpeed and Apex do: a loss scale (and its
        # overflow point) means what it means there, whatever the step's token count.
        tokens = jnp.maximum(lm.loss_weights(batch).sum(), 1.0)
        grads, (nll, z, weight, auxiliary), fp8_state = accumulate_gradients(
            functools.partial(grad_fn, fp8_state=state.fp8_state, scale=scale / tokens), state.params, batch, rng,
            config.grad_accum_steps)
        weight = jnp.maximum(weight, 1.0)
        grads = jax.tree.map(lambda g: g * (tokens / (weight * scale)), grads)
        grad_finite = leaf_finite(grads)
        params, opt_state, old_opt_state, update_finite = apply_update(tx, state, grads,
                                                                       config.offload_optimizer_state)
        finite = grad_finite.all() & jnp.isfinite(nll) & update_finite
        skip = ~finite  # never apply a non-finite update: 'skip' goes on, 'stop' stops with a clean state
        keep_old = functools.partial(jax.tree.map, lambda old, new: jnp.where(skip, old, new))
        new_state = state.replace(
            step=state.step + 1,
            params=keep_old(state.params, params),
            opt_state=keep_old(old_opt_state, opt_state),
            fp8_state=keep_old(state.fp8_state, fp8_state),
            loss_scale=state.loss_scale.update(finite, config.loss_scale) if state.loss_scale is not None else None,
        )
        metrics = {"loss": nll / weight, "z_loss": z / weight, "grad_norm": optax.tree.norm(grads),
                   "learning_rate": schedule(optim.applied_updates(old_opt_state)), "tokens": weight,
                   "skipped": skip.astype(jnp.int32), "update_finite": update_finite.astype(jnp.int32),
                   "grad_finite": grad_finite}
        metrics.update(auxiliary_metrics(auxiliary, weight), **loss_scale_metric(state.loss_scale))
        return new_state, metrics

    return train_step


def apply_update(tx: optax.GradientTransformation, state: TrainState, grads: Any,
                 offload: bool) -> tuple[Any, Any, Any, jax.Array]:
    """optax's update of `state`'s parameters and optimizer state by `grads` (the optimizer state brought back
    from host memory first when `offload`ed): (params, opt_state, the optimizer state as the step read it, whether
    every new parameter and statistic is finite: an update can overflow where the gradients did not)."""
    old_opt_state = state.opt_state
    if offload:
        old_opt_state = jax.device_put(old_opt_state, jax.memory.Space.Device)
    updates, opt_state = tx.update(grads, old_opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    return params, opt_state, old_opt_state, leaf_finite(params).all() & leaf_finite(opt_state).all()


def loss_scale_metric(loss_scale: LossScale | None) -> Metrics:
    """{'loss_scale': the scale the step used} under float16 loss scaling, else nothing."""
    return {} if loss_scale is None else {"loss_scale": loss_scale.scale}


def auxiliary_metrics(auxiliary: dict[str, jax.Array], weight: jax.Array) -> Metrics:
    """The step's auxiliary losses (per scored token, as the loss) and each expert's share of the router's
    assignments as `expert_share/<expert>` (TensorBoard groups them): scalars, as every metric."""
    metrics = {}
    for name, value in auxiliary.items():
        value = value / weight
        if value.ndim:
            metrics.update({f"{name}/{i}": value[i] for i in range(value.shape[0])})
        else:
            metrics[name] = value
    return metrics


def make_eval_step(lm: LanguageModel, microbatches: int = 1) -> Callable[[Any, Batch], Metrics]:
    """Σ nll, Σ correct (the target is the argmax) and Σ weights of one batch, deterministic (no
    dropout), in `microbatches` pieces as the train step accumulates (GRAD_ACCUM_STEPS), with
    chunked scores (lm.score): evaluation never holds more activations or logits than training."""

    def eval_step(params: Any, batch: Batch) -> Metrics:
        def sums(micro: Batch, _) -> Metrics:
            scores = lm.score(params, micro)
            weights = lm.loss_weights(micro)
            return {"nll_sum": -(scores["log_prob"] * weights).sum(),
                    "accuracy_sum": (scores["correct"] * weights).sum(), "weight_sum": weights.sum()}

        return sum_over_microbatches(sums, batch, microbatches)

    return eval_step
