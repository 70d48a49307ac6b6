"""lm-eval tasks during training: every `every` steps the current parameters answer the named tasks, and their
metrics (`lm_eval/<task>/<metric>`) go to metrics.jsonl and TensorBoard beside the validation loss.

    --gin.lm_eval_during_training.tasks="'t5xl_choices,hellaswag'" --gin.lm_eval_during_training.every=1000

The tasks and their data are loaded once, before the first step (a task that cannot be had is refused then, in
one line); each evaluation reuses what was compiled before (the scoring step and the decoders). Every process
computes its share, as the CLI does; process 0 writes. Standard errors are not bootstrapped (bootstrap_iters=0):
a training log wants the values.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any

from absl import logging

from partitioning import Partitioner
from t5x_like import checks
from t5x_like.errors import UserError
from t5x_like.eval.harness import tasks as harness_tasks


@dataclasses.dataclass(frozen=True)
class LmEvalDuringTraining:
    """Which lm-eval tasks (comma-separated names; '' = none) to run every `every` steps (0 = never), from which
    include path, with how many shots (None: each task's own), on how many documents per task (None: all), in
    batches of `batch_size` rows."""

    tasks: str = ""
    every: int = 0
    include_path: str | None = None
    num_fewshot: int | None = None
    limit: int | None = None
    batch_size: int = 8

    @property
    def enabled(self) -> bool:
        return bool(self.tasks.strip()) and self.every > 0

    def check(self) -> None:
        """The settings in range (in gin's names), before anything is loaded."""
        checks.non_negative_int("lm_eval_during_training.every", self.every, fix="0 = never")
        checks.positive_int("lm_eval_during_training.batch_size", self.batch_size)
        if self.num_fewshot is not None:
            checks.non_negative_int("lm_eval_during_training.num_fewshot", self.num_fewshot)
        if self.limit is not None:
            checks.positive_int("lm_eval_during_training.limit", self.limit)
        if self.every and not self.tasks.strip():
            raise UserError(f"lm_eval_during_training.every={self.every} but no tasks: set "
                            "lm_eval_during_training.tasks='name,name' (lm-eval task names), or every=0.")


class TrainingEvaluator:
    """Runs the configured tasks on a training run's parameters; call it with (params, step) when `due(step)`."""

    def __init__(self, settings: LmEvalDuringTraining, config, partitioner: Partitioner, tokenizer):
        settings.check()
        harness_tasks.require_lm_eval()
        from t5x_like.eval.harness.model import CheckpointLM, refusal
        from t5x_like.lm import make_lm

        kind = make_lm(config).KIND
        if kind != "decoder_only":
            raise UserError("lm_eval_during_training: " + refusal(f"the {config.family} model", kind))
        self.settings = settings
        self.manager, self.built = harness_tasks.load_tasks(harness_tasks.task_names(settings.tasks),
                                                            settings.include_path)
        self._new_lm = lambda params, step: CheckpointLM(config, params, partitioner, tokenizer,
                                                         batch_size=settings.batch_size, name=f"step {step}")
        self._lm = None

    def due(self, step: int) -> bool:
        return step % self.settings.every == 0

    def __call__(self, params: Any, step: int) -> dict[str, float | None]:
        """The tasks' metrics on `params`, as `lm_eval/<task>/<metric>` (logged, and returned for the writer)."""
        started = time.perf_counter()
        if self._lm is None:
            self._lm = self._new_lm(params, step)
        else:
            self._lm.set_params(params)
            self._lm.name = f"step {step}"
        results = harness_tasks.evaluate(self._lm, self.manager, self.built, num_fewshot=self.settings.num_fewshot,
                                         limit=self.settings.limit, bootstrap_iters=0)
        metrics = harness_tasks.flat_metrics(results)
        logging.info("step %d: lm-eval %s (%.1fs)", step, ", ".join(f"{k.removeprefix('lm_eval/')} {v:.4g}"
                                                                     for k, v in metrics.items() if v is not None),
                     time.perf_counter() - started)
        return metrics
