"""Validation during training: how many batches each evaluation reads (EVAL_STEPS, or the whole split) and the
loss, perplexity and token accuracy over them, each example counted at most once."""
from __future__ import annotations

import math

import jax
from absl import logging

from t5x_like.errors import UserError
from t5x_like.experiment import Experiment

ALL_BATCHES = -1
"""EVAL_STEPS = -1: every batch of the validation split."""


def validation_batches(source, eval_steps: int) -> int:
    """How many batches each evaluation reads: EVAL_STEPS, or the whole split (-1, or when the split holds fewer;
    said here, once)."""
    available = source.num_batches
    if available is None:
        if eval_steps == ALL_BATCHES:
            raise UserError("EVAL_STEPS=-1 (the whole validation split) needs a split whose length is known ahead "
                            "(token files, pair and labelled files); a TFDS source streams its split: give "
                            "EVAL_STEPS a number of batches.")
        return eval_steps
    rows = f"{available} global batches of BATCH_SIZE rows, the last filled up with rows that count nothing"
    if eval_steps == ALL_BATCHES:
        logging.info("validation: the whole split every time: %s", rows)
    elif eval_steps > available:
        logging.warning("validation: EVAL_STEPS=%d, but the validation split holds only %s; every evaluation "
                        "reads the whole split once (EVAL_STEPS=-1 says so)", eval_steps, rows)
    else:
        return eval_steps
    return available


def evaluate(exp: Experiment, params, source, batches: int, writer, step) -> None:
    """Validation loss and token accuracy over the first `batches` batches of the validation split."""
    source.reset()
    sums = {"nll_sum": 0.0, "accuracy_sum": 0.0, "weight_sum": 0.0}
    for _ in range(batches):
        out = jax.device_get(exp.eval_step(params, exp.global_batch(next(source))))
        sums = {k: total + float(out[k]) for k, total in sums.items()}
    weight = max(sums["weight_sum"], 1.0)
    loss, accuracy = sums["nll_sum"] / weight, sums["accuracy_sum"] / weight
    writer.write(step, {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 80.0)), "eval_accuracy": accuracy})
    logging.info("step %d: validation loss %.4f, perplexity %.2f, token accuracy %.4f", step, loss,
                 math.exp(min(loss, 80.0)), accuracy)
