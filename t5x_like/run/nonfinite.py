"""What a step with a non-finite loss, gradients or update leads to, on the host, after the step (step_fns.py's
train step never applies such an update): a warning and the run goes on, or a stop that sets aside the
checkpoints holding the state that gave it, so no restart resumes from them."""
from __future__ import annotations

import math
from typing import Callable

import jax
import numpy as np
from absl import logging

from t5x_like import step_fns
from t5x_like.checkpoint import store
from t5x_like.errors import UserError

NONFINITE_SUFFIX = ".nonfinite"


class NonfiniteLossError(UserError, FloatingPointError):
    """A run stopped by a non-finite loss, gradients or update. `bad_from`: the first step whose state gave a
    non-finite loss or gradients (its checkpoints and later ones are not resumed from); None when the state
    was fine (only the update overflowed)."""

    def __init__(self, message: str, bad_from: int | None):
        super().__init__(message)
        self.bad_from = bad_from


class NonfiniteCheck:
    """What a step with a non-finite loss, gradients or update leads to (the step itself never applied
    it): a warning ('skip'), or a NonfiniteLossError naming the step, what was not finite and likely causes: at
    once ('stop'), or after `in_a_row` steps in a row whose loss or gradients were not finite (the state itself is
    bad: skipping cannot get past it). Every process reads the same replicated metrics, so every process stops at
    the same step.

    A float16 run's dynamic loss scale (`loss_scale`, not static) overflows by design: a step whose loss is
    finite but whose scaled gradients are not is the scaler's to handle (the update skipped, the scale backing
    off, as DeepSpeed and Megatron do: Megatron's scale starts at 2**32), logged, not counted as a bad state,
    until the scale is at its minimum and cannot back off further."""

    def __init__(self, params, on_nonfinite: str, in_a_row: int = 5,
                 loss_scale: step_fns.LossScaleConfig | None = None):
        self.leaf_names = [jax.tree_util.keystr(path, simple=True, separator="/")
                           for path, _ in jax.tree_util.tree_leaves_with_path(params)]
        self.on_nonfinite, self.in_a_row = on_nonfinite, in_a_row
        self.dynamic_scale = loss_scale is not None and not loss_scale.static_scale
        self.min_scale = loss_scale.min_scale if self.dynamic_scale else None
        self.bad_since: int | None = None  # the first step of the current run of non-finite losses / gradients

    def scaler_overflow(self, values: dict, bad: list[str]) -> bool:
        """Only the scaled gradients overflowed, and the dynamic loss scale can still back off."""
        return (self.dynamic_scale and bool(bad) and math.isfinite(values["loss"])
                and values["loss_scale"] > self.min_scale)

    def __call__(self, step: int, values: dict, grad_finite: np.ndarray) -> None:
        bad = [name for name, finite in zip(self.leaf_names, grad_finite) if not finite]
        if values["skipped"] and self.scaler_overflow(values, bad):
            logging.info("step %d: the gradients overflowed at loss scale %g; update skipped, the scale backs off",
                         step, values["loss_scale"])
            return
        state_bad = values["skipped"] and (bad or not math.isfinite(values["loss"]))
        self.bad_since = (self.bad_since or step) if state_bad else None
        if not values["skipped"]:
            return
        what = (f"loss is {values['loss']}" if not math.isfinite(values["loss"]) else
                f"loss is {values['loss']:.4f} but the gradients are not finite" if bad else
                f"loss is {values['loss']:.4f} and the gradients are finite, but the update overflowed (it would "
                "have made parameters or optimizer statistics non-finite)")
        where = (f"; non-finite gradients in {len(bad)} of {len(self.leaf_names)} parameters: "
                 f"{', '.join(bad[:8])}{', ...' if len(bad) > 8 else ''}") if bad else ""
        skipping = self.on_nonfinite == "skip" or "loss_scale" in values
        if skipping and not (state_bad and step - self.bad_since + 1 >= self.in_a_row):
            logging.warning("step %d: %s%s; update skipped%s", step, what, where,
                            f" at loss scale {values['loss_scale']:g}" if "loss_scale" in values else "")
            return
        if skipping:
            what = (f"{step - self.bad_since + 1} steps in a row (train.nonfinite_in_a_row) had a non-finite loss "
                    f"or gradients, from step {self.bad_since}: the model's state itself is bad, skipping cannot get "
                    f"past it; at step {step} the {what}")
        raise NonfiniteLossError(
            f"step {step}: {what}{where}. The update was not applied. Likely causes: a learning rate too high for "
            "this model or batch (lower LEARNING_RATE, lengthen WARMUP_STEPS, keep gradient clipping on); "
            "float16 overflow (use bfloat16 or float32); bad input (token ids beyond the vocabulary, NaN loss "
            "weights)." + ("" if skipping else " Or set build_experiment.on_nonfinite='skip' to skip such steps."),
            bad_from=(self.bad_since - 1) if self.bad_since else None)


def set_aside_bad_states(ckpt: store.Checkpointer) -> Callable[..., None]:
    """An ExitStack callback: a run stopped by NonfiniteLossError sets aside the checkpoints that hold the
    state which gave the non-finite loss or gradients (the step before it, and any later), so no restart
    resumes from them, and its message says where a restart resumes."""

    def on_exit(exc_type, error, _) -> None:
        if not isinstance(error, NonfiniteLossError):
            return
        moved = ckpt.set_aside_from(error.bad_from, NONFINITE_SUFFIX) if error.bad_from is not None else []
        latest = ckpt.latest_step()
        resumes = (f"a restart resumes from step {latest}" if latest is not None else
                   "there is no earlier checkpoint: a restart starts the run over")
        if moved:
            names = ", ".join(f"{s}{NONFINITE_SUFFIX}" for s in moved)
            resumes = (f"checkpoint step(s) {', '.join(map(str, moved))} held that state and were set aside in "
                       f"{ckpt.directory} as {names}; {resumes}")
        raise NonfiniteLossError(f"{error} Nothing of this or a later step was saved; {resumes}.",
                                 error.bad_from) from None

    return on_exit
