"""BATCH_SIZE_RAMPUP: Megatron-LM's batch-size ramp-up (`--rampup-batch-size START INCREMENT SAMPLES`), step by
step as Megatron's RampupBatchsizeNumMicroBatchesCalculator counts it.

The batch grows from START by INCREMENT to BATCH_SIZE (G) in (G - START) / INCREMENT increments of SAMPLES /
increments samples each: a step that starts with `consumed` samples read takes G once consumed > SAMPLES, else
START + int(consumed / (SAMPLES / increments)) x INCREMENT. The step keeps its compiled shape of G rows: the
training loader (loader.batch_source) gives step s the stream's rows C(s) .. C(s) + b(s) - 1 first, C(s) being the
rows the steps before it took, and fills the rest with rows that count nothing (zero loss weights, no label), so a
ramp-up step computes as much as a full one and its loss and gradient are those of its b(s) rows.
"""
from __future__ import annotations

import bisect
import math
from typing import Any

import numpy as np

from t5x_like.errors import UserError

SETTING = "BATCH_SIZE_RAMPUP"
EXAMPLE = "(32, 32, 6000000), Megatron's --rampup-batch-size 32 32 6000000"


class BatchRampup:
    """The batch size of every step of a ramp-up to `batch_size` rows, kept as phases: the steps from `first_step[k]`
    on take `batches[k]` rows each, the first of them starting with `consumed[k]` samples read; the last phase
    (`batch_size` rows) lasts for ever."""

    def __init__(self, start: int, increment: int, samples: int, batch_size: int):
        check(start, increment, samples, batch_size)
        self.start, self.increment, self.samples, self.batch_size = start, increment, samples, batch_size
        self._per_increment = samples / ((batch_size - start) // increment)
        self._first_step, self._consumed, self._batches = [0], [0], [self.megatron_batch(0)]
        while self._batches[-1] < batch_size:
            steps = self._phase_steps(self._consumed[-1], self._batches[-1])
            self._first_step.append(self._first_step[-1] + steps)
            self._consumed.append(self._consumed[-1] + steps * self._batches[-1])
            self._batches.append(self.megatron_batch(self._consumed[-1]))
        self._first_step_array, self._batch_array = np.array(self._first_step), np.array(self._batches)

    @property
    def setting(self) -> tuple[int, int, int]:
        """(start, increment, samples) as BATCH_SIZE_RAMPUP gives them."""
        return self.start, self.increment, self.samples

    @property
    def full_from(self) -> int:
        """The first step that takes `batch_size` rows."""
        return self._first_step[-1]

    def describe(self) -> str:
        """The schedule in a line, its steps counted from 1 as the run logs them."""
        return (f"{self.start} rows at first, {self.increment} more every {self._per_increment:g} samples, "
                f"{self.batch_size} from step {self.full_from + 1} on ({SETTING}={self.setting}; every step computes "
                f"{self.batch_size} rows)")

    def megatron_batch(self, consumed: int) -> int:
        """The batch of a step that starts with `consumed` samples read (Megatron's update())."""
        if consumed > self.samples:
            return self.batch_size
        return self.start + int(consumed / self._per_increment) * self.increment

    def _phase_steps(self, consumed: int, batch: int) -> int:
        """Steps of `batch` rows from `consumed` on, until the batch grows (the first after `samples` has)."""
        low, high = 1, (self.samples - consumed) // batch + 1
        while low < high:
            middle = (low + high) // 2
            if self.megatron_batch(consumed + middle * batch) == batch:
                low = middle + 1
            else:
                high = middle
        return low

    def _phase(self, step: int) -> int:
        return bisect.bisect_right(self._first_step, step) - 1

    def batch_at(self, step: int) -> int:
        """The rows step `step` (from 0) trains on."""
        return self._batches[self._phase(step)]

    def consumed_before(self, step: int) -> int:
        """The samples the steps before `step` trained on."""
        k = self._phase(step)
        return self._consumed[k] + (step - self._first_step[k]) * self._batches[k]

    def counted(self, rows: np.ndarray) -> np.ndarray:
        """bool per row of the ramped stream (row s x batch_size + j is step s's row j): whether it counts, j < b(s)."""
        steps, within = np.divmod(rows, self.batch_size)
        return within < self._batch_array[np.searchsorted(self._first_step_array, steps, side="right") - 1]

    def steps_to_consume(self, samples: int) -> int:
        """The steps whose batches add up to at least `samples` (a schedule length Megatron counts in samples)."""
        k = bisect.bisect_right(self._consumed, samples) - 1
        return self._first_step[k] + math.ceil((samples - self._consumed[k]) / self._batches[k])

    def train_steps(self, train_samples: int) -> int:
        """Megatron's steps for --train-samples (update_train_iters): the ramp's steps while the samples read are at
        most SAMPLES and `train_samples`, then whole full batches of what is left."""
        limit = min(self.samples, train_samples)
        k = bisect.bisect_right(self._consumed, limit) - 1
        steps = self._first_step[k] + (limit - self._consumed[k]) // self._batches[k] + 1
        return steps + max(0, train_samples - self.consumed_before(steps)) // self.batch_size

    def record(self) -> dict[str, int]:
        """What a data position records of the ramp-up (a resume must ramp the same way)."""
        return {"start": self.start, "increment": self.increment, "samples": self.samples,
                "batch_size": self.batch_size}


def batch_rampup(setting: Any, batch_size: int) -> BatchRampup | None:
    """BATCH_SIZE_RAMPUP's value (None, or (start, increment, samples)) for a global batch of `batch_size` rows."""
    if setting is None:
        return None
    if not isinstance(setting, (tuple, list)) or len(setting) != 3 or \
            any(not isinstance(v, int) or isinstance(v, bool) for v in setting):
        raise UserError(f"{SETTING}={setting!r}: expected None or three whole numbers (start, increment, samples), "
                        f"e.g. {EXAMPLE}.")
    return BatchRampup(*setting, batch_size=batch_size)


def check(start: int, increment: int, samples: int, batch_size: int) -> None:
    """Megatron's conditions on a ramp-up, each refused in one line naming the fix."""
    given = f"{SETTING}=({start}, {increment}, {samples})"
    if start < 1 or increment < 1 or samples < 1:
        raise UserError(f"{given}: start, increment and samples must be positive (samples 0 would make Megatron-LM "
                        f"divide by zero), e.g. {EXAMPLE}; or {SETTING}=None for no ramp-up.")
    if start >= batch_size:
        raise UserError(f"{given}: the ramp starts at {start} rows, not below BATCH_SIZE={batch_size}, so there is "
                        f"nothing to ramp (Megatron-LM divides by zero on start = BATCH_SIZE): give a start below "
                        f"BATCH_SIZE, or {SETTING}=None.")
    if (batch_size - start) % increment:
        raise UserError(f"{given}: BATCH_SIZE={batch_size} - start {start} = {batch_size - start} is not a multiple of "
                        f"the increment {increment}; pick an increment that divides it.")
