"""Optimizer: AdamW with decoupled weight decay on matrices only, global-norm clipping, and a
warmup + decay learning-rate schedule."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import optax

from t5x_like.errors import UserError

SCHEDULES = ("cosine", "linear", "constant")


class Optimizer(NamedTuple):
    tx: optax.GradientTransformation
    schedule: optax.Schedule


def learning_rate_schedule(*, peak: float, warmup_steps: int, total_steps: int, decay: str = "cosine",
                           min_ratio: float = 0.1) -> optax.Schedule:
    """Linear warmup from 0 to `peak`, then cosine / linear decay to `min_ratio * peak` at
    `total_steps` (or stay constant)."""
    if decay not in SCHEDULES:
        raise UserError(f"learning-rate decay {decay!r} is unknown; choose one of {SCHEDULES}.")
    if warmup_steps >= total_steps and decay != "constant":
        raise UserError(
            f"WARMUP_STEPS={warmup_steps} must be smaller than TRAIN_STEPS={total_steps} for "
            f"{decay!r} decay; lower the warmup or use decay='constant'."
        )
    warmup = optax.linear_schedule(0.0, peak, max(warmup_steps, 1))
    decay_steps = max(total_steps - warmup_steps, 1)
    end = min_ratio * peak
    if decay == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps, alpha=min_ratio)
    elif decay == "linear":
        after = optax.linear_schedule(peak, end, decay_steps)
    else:
        after = optax.constant_schedule(peak)
    return optax.join_schedules([warmup, after], [warmup_steps])


def decay_mask(params: Any) -> Any:
    """True for weight matrices ('*kernel'); biases, norm scales and embeddings are not decayed."""
    def is_kernel(path, _) -> bool:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return bool(names) and str(names[-1]).endswith("kernel")

    return jax.tree_util.tree_map_with_path(is_kernel, params)


def make_optimizer(*, learning_rate: float, warmup_steps: int, total_steps: int, decay: str = "cosine",
                   min_learning_rate_ratio: float = 0.1, b1: float = 0.9, b2: float = 0.95,
                   eps: float = 1e-8, weight_decay: float = 0.1, clip_grad_norm: float = 1.0) -> Optimizer:
    """AdamW (GPT-2/GPT-3 defaults) behind global-norm clipping (0 disables clipping)."""
    schedule = learning_rate_schedule(peak=learning_rate, warmup_steps=warmup_steps, total_steps=total_steps,
                                      decay=decay, min_ratio=min_learning_rate_ratio)
    adamw = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=decay_mask)
    clip = optax.clip_by_global_norm(clip_grad_norm) if clip_grad_norm > 0 else optax.identity()
    return Optimizer(optax.chain(clip, adamw), schedule)
