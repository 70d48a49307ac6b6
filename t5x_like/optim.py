"""Optimizers: AdamW with decoupled weight decay on matrices only (GPT recipes) or Adafactor with
factored second moments (T5X's defaults), global-norm clipping, and learning-rate schedules: linear
warmup then cosine / linear / constant down to a floor (absolute, Megatron's --min-lr, or a ratio of the
peak), Noam's linear warmup then inverse square root, or T5's inverse square root ('rsqrt'); lengths in
steps or as fractions of the run."""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from absl import logging

from models.layers import STACKED
from t5x_like import checks
from t5x_like.errors import UserError

SCHEDULES = ("cosine", "linear", "constant", "rsqrt", "noam")
OPTIMIZERS = ("adamw", "adafactor")


class Optimizer(NamedTuple):
    tx: optax.GradientTransformation
    schedule: optax.Schedule


def run_steps(name: str, value: Any, of_steps: int, of_name: str) -> int:
    """A length in steps, given as steps (an integer >= 0) or as a fraction of `of_steps` (a float in (0, 1),
    rounded to whole steps), as Megatron's --warmup / --lr-warmup-fraction and NeoX's `warmup` give it."""
    if isinstance(value, float) and 0 < value < 1:
        return int(round(value * of_steps))
    if isinstance(value, float):
        raise UserError(f"{name}={value!r}: give whole steps (an integer, no decimal point) or a fraction of "
                        f"{of_name} below 1 (e.g. 0.01 = 1%).")
    return checks.non_negative_int(name, value, fix=f"or a fraction of {of_name} such as 0.01")


class ScheduleSteps(NamedTuple):
    """A schedule's settings resolved: its lengths in steps and its floor."""
    warmup: int
    decay_end: int  # the step cosine / linear decay reaches the floor (decay_steps, default TRAIN_STEPS)
    floor: float | None  # the lowest rate: None where nothing floors it (constant; rsqrt / noam without `minimum`)


def resolve_schedule(*, peak: float, warmup_steps: int | float, total_steps: int, decay: str = "cosine",
                     min_ratio: float = 0.1, decay_steps: int | float | None = None,
                     minimum: float | None = None) -> ScheduleSteps:
    """learning_rate_schedule's lengths in steps (fractions resolved) and floor, checked; its arguments."""
    if decay not in SCHEDULES:
        raise UserError(f"learning-rate decay {decay!r} is unknown; choose one of {SCHEDULES}.")
    checks.non_negative_int("TRAIN_STEPS", total_steps)
    decay_end = total_steps if decay_steps is None else run_steps("optim.make_optimizer.decay_steps", decay_steps,
                                                                  total_steps, "TRAIN_STEPS")
    warmup = run_steps("WARMUP_STEPS", warmup_steps, decay_end,
                       "TRAIN_STEPS" if decay_steps is None else "optim.make_optimizer.decay_steps")
    if minimum is not None:
        checks.finite_float("optim.make_optimizer.min_learning_rate", minimum, minimum=0.0, maximum=peak,
                              fix="at most LEARNING_RATE")
    if decay in ("rsqrt", "noam"):
        if warmup < 1:
            raise UserError(f"the {decay!r} schedule decays as sqrt(WARMUP_STEPS / step); set WARMUP_STEPS >= 1 "
                            f"({'T5 uses 10000' if decay == 'rsqrt' else 'the Transformer paper uses 4000'}).")
        return ScheduleSteps(warmup, decay_end, minimum)
    if warmup >= decay_end and decay != "constant":
        ends = f"TRAIN_STEPS={total_steps}" if decay_steps is None else f"optim.make_optimizer.decay_steps={decay_end}"
        raise UserError(f"WARMUP_STEPS={warmup} must be smaller than {ends} for {decay!r} decay; lower the warmup "
                        "or use decay='constant'.")
    if decay == "constant":
        return ScheduleSteps(warmup, decay_end, None)
    return ScheduleSteps(warmup, decay_end, min_ratio * peak if minimum is None else minimum)


def learning_rate_schedule(*, peak: float, warmup_steps: int | float, total_steps: int, decay: str = "cosine",
                           min_ratio: float = 0.1, decay_steps: int | float | None = None,
                           minimum: float | None = None) -> optax.Schedule:
    """The learning rate at each update.

    cosine / linear / constant: linear warmup from 0 to `peak` over `warmup_steps`, then cosine or linear
    decay to the floor at `decay_steps` (default `total_steps`; Megatron's --lr-decay-iters), which it keeps
    after (or stay at the peak): the floor is `minimum` (Megatron's --min-lr) when set, else min_ratio * peak.
    noam: linear warmup, then peak * sqrt(warmup_steps / step) (Vaswani et al.'s schedule, peaking at `peak`).
    rsqrt: T5X's `constant * rsqrt_decay`: `peak` for the first `warmup_steps` steps, then
    peak * sqrt(warmup_steps / step) (no ramp; T5 uses peak 0.01, 10k steps). noam and rsqrt never end; only
    `minimum`, when set, floors them. A float in (0, 1) is a fraction: `decay_steps` of `total_steps`,
    `warmup_steps` of the decay length (as Megatron and NeoX count their warmup fraction)."""
    steps = resolve_schedule(peak=peak, warmup_steps=warmup_steps, total_steps=total_steps, decay=decay,
                             min_ratio=min_ratio, decay_steps=decay_steps, minimum=minimum)
    if decay in ("rsqrt", "noam"):
        return inverse_square_root(peak, steps.warmup, decay, steps.floor)
    ramp = optax.linear_schedule(0.0, peak, max(steps.warmup, 1))
    length = max(steps.decay_end - steps.warmup, 1)
    if decay == "cosine":
        after = optax.cosine_decay_schedule(peak, length, alpha=steps.floor / peak if peak else 0.0)
    elif decay == "linear":
        after = optax.linear_schedule(peak, steps.floor, length)
    else:
        after = optax.constant_schedule(peak)
    return optax.join_schedules([ramp, after], [steps.warmup])


def inverse_square_root(peak: float, warmup: int, decay: str, minimum: float | None) -> optax.Schedule:
    """'rsqrt' (T5X: the peak held for `warmup` >= 1 steps) or 'noam' (a linear ramp to the peak over `warmup`
    steps), then peak * sqrt(warmup / step); never below `minimum` when it is set."""

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        decayed = peak * jax.lax.rsqrt(jnp.maximum(step, warmup) / warmup)
        rate = jnp.minimum(peak * step / warmup, decayed) if decay == "noam" else decayed
        return rate if minimum is None else jnp.maximum(rate, minimum)

    return schedule


def describe_schedule(settings: OptimizerSettings, total_steps: int) -> str:
    """The schedule of `settings` over `total_steps` in words, resolved by resolve_schedule: the warmup in steps (and
    the fraction it came from), where the decay ends, and which floor applies."""
    learning_rate, warmup_steps, decay = settings.learning_rate, settings.warmup_steps, settings.decay
    decay_steps, min_learning_rate = settings.decay_steps, settings.min_learning_rate
    min_learning_rate_ratio = settings.min_learning_rate_ratio
    steps = resolve_schedule(peak=learning_rate, warmup_steps=warmup_steps, total_steps=total_steps, decay=decay,
                             min_ratio=min_learning_rate_ratio, decay_steps=decay_steps, minimum=min_learning_rate)
    given = f" (WARMUP_STEPS = {warmup_steps!r} of {steps.decay_end})" if isinstance(warmup_steps, float) else ""
    if decay in ("rsqrt", "noam"):
        return describe_inverse_square_root(learning_rate, steps, decay, total_steps, given)
    warmup = f"warmup {steps.warmup} steps{given}" if steps.warmup else "no warmup"
    if decay == "constant":
        return (f"{warmup}, then constant at LEARNING_RATE {learning_rate:g} (no decay: min_learning_rate and "
                "min_learning_rate_ratio are unused)")
    ends = f"step {steps.decay_end}"
    if isinstance(decay_steps, float):
        ends += f" (make_optimizer.decay_steps = {decay_steps!r} of TRAIN_STEPS {total_steps})"
    elif decay_steps is not None:
        ends += " (make_optimizer.decay_steps)"
    floor = (f"floor {steps.floor:g} (min_learning_rate, absolute; min_learning_rate_ratio is ignored)"
             if min_learning_rate is not None else
             f"floor {steps.floor:g} (min_learning_rate_ratio {min_learning_rate_ratio:g} x LEARNING_RATE; "
             "min_learning_rate unset)")
    return f"{warmup}, {decay} decay to {ends}, {floor}"


def describe_inverse_square_root(peak: float, steps: ScheduleSteps, decay: str, total_steps: int, given: str) -> str:
    """'rsqrt' or 'noam' in words: how it starts, the rate it reaches at TRAIN_STEPS, and its floor, if any."""
    start = (f"LEARNING_RATE {peak:g} held for {steps.warmup} steps{given}" if decay == "rsqrt" else
             f"warmup to LEARNING_RATE {peak:g} over {steps.warmup} steps{given}")
    at_end = float(inverse_square_root(peak, steps.warmup, decay, steps.floor)(total_steps))
    floor = (f"floor {steps.floor:g} (min_learning_rate)" if steps.floor is not None else
             f"no floor (min_learning_rate unset; min_learning_rate_ratio is unused by {decay!r})")
    return (f"{decay}: {start}, then LEARNING_RATE x sqrt({steps.warmup} / step), {at_end:.3g} at step {total_steps} "
            f"(TRAIN_STEPS); {floor}")


def decay_mask(params: Any, *, embeddings: bool = False) -> Any:
    """True where AdamW's weight decay applies: weight matrices ('*kernel') and, with `embeddings`,
    the vocabulary tables and untied output heads ('embedding'), as Megatron-LM decays every
    weight but biases and norms. Biases and norm scales are never decayed."""
    suffixes = ("kernel", "embedding") if embeddings else ("kernel",)

    def decayed(path, _) -> bool:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return bool(names) and str(names[-1]).endswith(suffixes)

    return jax.tree_util.tree_map_with_path(decayed, params)


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerSettings:
    """The optimizer and its learning-rate schedule (gin: optim.make_optimizer.*): OPTIMIZER `name` behind
    global-norm clipping (0 disables clipping), following the schedule `decay` (learning_rate_schedule): WARMUP_STEPS
    and `decay_steps` in steps or as fractions, and a floor of `min_learning_rate` (absolute, Megatron's --min-lr)
    when set, else of min_learning_rate_ratio x LEARNING_RATE. The schedule's length is the run's (TRAIN_STEPS).

    'adamw': GPT-2/GPT-3 defaults (b1, b2, eps, weight_decay on matrices only; `decay_embeddings` decays the
    vocabulary tables too, as Megatron-LM does). 'adafactor': optax's, with T5X's defaults — factored second
    moments for dimensions >= 128, decay rate 0.8, update clipping at RMS 1.0, updates scaled by the parameter's
    RMS, no momentum, no weight decay — all per layer (`per_layer`), so scanned and unrolled layers train alike."""

    learning_rate: float
    warmup_steps: int | float
    name: str = "adamw"
    decay: str = "cosine"
    decay_steps: int | float | None = None
    min_learning_rate: float | None = None
    min_learning_rate_ratio: float = 0.1
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    decay_embeddings: bool = False
    clip_grad_norm: float = 1.0
    adafactor_decay_rate: float = 0.8


def make_optimizer(settings: OptimizerSettings, total_steps: int) -> Optimizer:
    """The optimizer `settings` describe, its schedule `total_steps` (TRAIN_STEPS) long."""
    check_settings(settings, total_steps)
    schedule = learning_rate_schedule(peak=settings.learning_rate, warmup_steps=settings.warmup_steps,
                                      total_steps=total_steps, decay=settings.decay,
                                      min_ratio=settings.min_learning_rate_ratio, decay_steps=settings.decay_steps,
                                      minimum=settings.min_learning_rate)
    if settings.name == "adamw":
        update = optax.adamw(schedule, b1=settings.b1, b2=settings.b2, eps=settings.eps,
                             weight_decay=settings.weight_decay,
                             mask=functools.partial(decay_mask, embeddings=settings.decay_embeddings))
    else:
        update = per_layer(optax.adafactor(schedule, decay_rate=settings.adafactor_decay_rate, clipping_threshold=1.0,
                                           multiply_by_parameter_scale=True, factored=True))
    clip = optax.clip_by_global_norm(settings.clip_grad_norm) if settings.clip_grad_norm > 0 else optax.identity()
    return Optimizer(optax.chain(clip, update), schedule)


def check_settings(settings: OptimizerSettings, total_steps: int) -> None:
    """The optimizer's numbers in range, each refusal naming its gin setting."""
    if settings.name not in OPTIMIZERS:
        raise UserError(f"OPTIMIZER={settings.name!r} is unknown; choose one of {OPTIMIZERS}.")
    checks.finite_float("LEARNING_RATE", settings.learning_rate, minimum=0.0, fix="e.g. --gin.LEARNING_RATE=3e-4")
    if settings.learning_rate == 0:
        logging.warning("LEARNING_RATE=0: every update is zero, so training leaves the parameters as they start "
                        "(weight decay too); set a positive LEARNING_RATE, e.g. --gin.LEARNING_RATE=3e-4")
    if not isinstance(settings.warmup_steps, float):
        checks.non_negative_int("WARMUP_STEPS", settings.warmup_steps, fix="or a fraction of the run such as 0.01")
    checks.non_negative_int("TRAIN_STEPS", total_steps)
    checks.finite_float("optim.make_optimizer.min_learning_rate_ratio", settings.min_learning_rate_ratio,
                        minimum=0.0, maximum=1.0)
    checks.finite_float("optim.make_optimizer.weight_decay", settings.weight_decay, minimum=0.0)
    checks.finite_float("optim.make_optimizer.clip_grad_norm", settings.clip_grad_norm, minimum=0.0,
                        fix="0 = no clipping")
    for beta in ("b1", "b2", "adafactor_decay_rate"):
        checks.finite_float(f"optim.make_optimizer.{beta}", getattr(settings, beta), minimum=0.0, maximum=1.0)
    checks.finite_float("optim.make_optimizer.eps", settings.eps, minimum=0.0, exclusive_minimum=True)


def per_layer(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """`inner`, a transformation that treats each parameter on its own (Adafactor: its factored second
    moments, update clipping and parameter scale), applied to each layer of a scanned stack on its own:
    a parameter under models.layers.STACKED holds its layers on a leading axis, and `inner` is vmapped
    over it, as T5X's Adafactor treats the 'layers' axis as a batch axis. Scanned and unrolled layers
    then get the same updates and the same state, stacked: an unrolled model's state is the scanned
    one's with each stacked entry split per layer (the conversion checkpoints make). `inner`'s state is
    a NamedTuple or a chain (tuple) of them whose `count` fields are step counts (scalars, one for the
    whole tree) and whose other fields hold one entry per parameter."""
    template, state_def = jax.tree_util.tree_flatten_with_path(
        jax.eval_shape(inner.init, jax.ShapeDtypeStruct((1,), jnp.float32)))
    is_count = [path[-1:] == (jax.tree_util.GetAttrKey("count"),) for path, _ in template]
    axes = state_def.unflatten([None if count else 0 for count in is_count])  # vmap: counts are shared

    def stacked(path) -> bool:
        return jax.tree_util.DictKey(STACKED) in path

    def init_leaf(path) -> Callable:
        return jax.vmap(inner.init, out_axes=axes) if stacked(path) else inner.init

    def update_leaf(path) -> Callable:
        return jax.vmap(inner.update, in_axes=(0, axes, 0), out_axes=(0, axes)) if stacked(path) else inner.update

    def merge(per_leaf: list, params_def) -> Any:
        """One state for the whole tree from its leaves' states (the counts are the same in each)."""
        columns = zip(*(state_def.flatten_up_to(s) for s in per_leaf))
        return state_def.unflatten([column[0] if count else params_def.unflatten(column)
                                    for count, column in zip(is_count, columns)])

    def init(params):
        leaves, params_def = jax.tree_util.tree_flatten_with_path(params)
        if not leaves:
            return inner.init(params)
        return merge([init_leaf(path)(p) for path, p in leaves], params_def)

    def update(updates, state, params=None):
        leaves, params_def = jax.tree_util.tree_flatten_with_path(updates)
        if params is None or not leaves:
            return inner.update(updates, state, params)
        columns = [part if count else params_def.flatten_up_to(part)
                   for count, part in zip(is_count, state_def.flatten_up_to(state))]

        def leaf_state(i: int) -> Any:
            return state_def.unflatten([c if count else c[i] for count, c in zip(is_count, columns)])

        results = [update_leaf(path)(g, leaf_state(i), p)
                   for i, ((path, g), p) in enumerate(zip(leaves, params_def.flatten_up_to(params)))]
        return params_def.unflatten([u for u, _ in results]), merge([s for _, s in results], params_def)

    return optax.GradientTransformation(init, update)


def applied_updates(opt_state: Any) -> jax.Array:
    """How many updates the optimizer has applied: the count its learning-rate schedule reads
    (a skipped, non-finite step does not advance it, so after a skip it trails the step number)."""
    is_schedule = lambda x: isinstance(x, optax.ScaleByScheduleState)  # noqa: E731
    counts = [leaf.count for leaf in jax.tree.leaves(opt_state, is_leaf=is_schedule) if is_schedule(leaf)]
    if not counts:
        raise ValueError("the optimizer state holds no learning-rate schedule (optax.ScaleByScheduleState)")
    return counts[0]


def init_state(tx: optax.GradientTransformation, params: Any) -> Any:
    """tx.init(params), keeping each statistic's logical axis names where it has its parameter's shape.
    Statistics of another shape (Adafactor's factored row and column moments, its [1]-shaped
    placeholders) are small: their names are dropped, so they are replicated."""
    is_box = lambda x: isinstance(x, nn.Partitioned)  # noqa: E731
    shapes = {(box.names, box.value.shape) for box in jax.tree.leaves(params, is_leaf=is_box) if is_box(box)}

    def fix(leaf):
        if is_box(leaf) and (leaf.names, leaf.value.shape) not in shapes:
            return leaf.replace(names=(None,) * leaf.value.ndim)
        return leaf

    return jax.tree.map(fix, tx.init(params), is_leaf=is_box)
