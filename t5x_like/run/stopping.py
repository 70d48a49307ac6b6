"""When a run stops before TRAIN_STEPS: decided at the same step by every process.

- A signal (SIGTERM from a scheduler, SIGINT from Ctrl-C). One process: a handler records it and the
  loop stops after the step in flight. Several processes: jax's preemption service (started by
  `jax.distributed.initialize`) catches SIGTERM on whichever process gets it, tells the others, and
  `multihost_utils.reached_preemption_sync_point` answers True on every process at the same step (the
  largest step any process had reached, plus one), so all of them stop there and checkpoint together.
  SIGINT is passed on as SIGTERM to take the same path.
- A non-finite loss or gradients: every process reads the same replicated step metrics, so every
  process stops at the same step without further agreement (nonfinite.NonfiniteCheck).
- The last step: the same on every process.
A process that dies is noticed by the coordination service's heartbeat: the others exit non-zero,
naming the missing task (distributed.initialize sets the timeout).
"""
from __future__ import annotations

import os
import signal

import jax
from jax.experimental import multihost_utils


class StopSignal:
    """SIGTERM / SIGINT turned into a stop at a step every process agrees on; `restore()` puts the
    previous handlers back."""

    def __init__(self):
        self.signum: int | None = None
        self._collective = jax.process_count() > 1
        # With several processes SIGTERM stays with jax's preemption notifier (a Python handler would
        # replace it); SIGINT is re-sent as SIGTERM so that it reaches the notifier too.
        handled = (signal.SIGINT,) if self._collective else (signal.SIGTERM, signal.SIGINT)
        self._previous = {s: signal.signal(s, self._handle) for s in handled}

    def _handle(self, signum, _frame):
        if self._collective:
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            self.signum = signum

    def reached(self, step: int) -> bool:
        """Whether to stop before running the step after `step`. Call it at every step, on every
        process, with the same step numbers (jax's sync point protocol requires it)."""
        if self._collective and multihost_utils.reached_preemption_sync_point(step):
            self.signum = signal.SIGTERM
        return self.signum is not None

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
