"""EPOCHS: a run measured in passes over its training split, as fine-tuning recipes count (ModelCenter's BoolQ
quickstart trains 5 epochs and evaluates the dev set after each; GPT2-Chinese's train.py --epochs 5 saves after
each).

Set, it decides the run's lengths before gin is finalised (the gin front-end, config/frontend.py, binds them), so
every command that reads the run (train, --print_config, compile) sees the same numbers: TRAIN_STEPS = EPOCHS x the
steps of one pass, ceil(training rows / BATCH_SIZE) (the last batch of a pass takes its missing rows from the next,
shuffled, pass), and EVAL_EVERY and CHECKPOINT_EVERY become one pass (EVAL_EVERY = 0 keeps validation off). The
rows are counted as training reads them (the objective's rows of DATA_PATH's training split; a blend's files added
up).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Mapping

from absl import logging

from t5x_like import checks, data
from t5x_like.errors import UserError


@dataclasses.dataclass(frozen=True)
class Batches:
    """What a pass's steps are counted with: the data's settings, BATCH_SIZE rows of FEATURE_LENGTHS, SEED, and
    BATCH_SIZE_RAMPUP (which EPOCHS refuses)."""

    source: data.SourceSettings
    batch_size: int
    feature_lengths: Mapping[str, int]
    seed: int
    batch_size_rampup: tuple[int, int, int] | None = None


def steps_per_pass(epochs: int, settings: Batches) -> int:
    """The steps of one pass over the training split `settings` read, for a run of `epochs` passes (checked)."""
    checks.positive_int("EPOCHS", epochs, fix="or None to count the run in TRAIN_STEPS")
    if settings.batch_size_rampup is not None:
        raise UserError(f"EPOCHS={epochs} with BATCH_SIZE_RAMPUP: a pass over the data is no whole number of steps "
                        "while the batch ramps up; set TRAIN_STEPS (and EVAL_EVERY, CHECKPOINT_EVERY) instead.")
    rows = training_rows(settings)
    batch = settings.batch_size
    steps = math.ceil(rows / batch)
    borrowed = steps * batch - rows
    logging.info("EPOCHS=%d: %d training rows per pass, %d steps of BATCH_SIZE=%d each: TRAIN_STEPS=%d, validation "
                 "and a checkpoint every %d steps%s", epochs, rows, steps, batch, epochs * steps, steps,
                 f" (the last batch of a pass takes its missing {borrowed} rows from the next pass, so the run's last "
                 f"steps begin epoch {epochs + 1})" if borrowed else "")
    return steps


def training_rows(settings: Batches) -> int:
    """The rows of one pass over the training split, as data.make_source reads them."""
    source = data.make_source("train", settings.source, batch_size=settings.batch_size,
                              feature_lengths=dict(settings.feature_lengths), seed=settings.seed, shard_index=0,
                              shard_count=1)
    try:
        rows = getattr(source, "rows_per_epoch", None)
    finally:
        source.close()
    if not rows:
        raise UserError("EPOCHS counts passes over the training split, but this source's length is not known ahead "
                        "(a TFDS stream): set TRAIN_STEPS instead.")
    return rows
