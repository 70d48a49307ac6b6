"""A training run's settings, typed: the loop's lengths and cadences (LoopSettings, gin's `train.*`) and RunSettings,
everything a run is made of (the loop's, the experiment's, the data's and lm-eval's settings, and the configuration
texts MODEL_DIR records). The gin front-end (t5x_like/config/) makes them once from the run files; the rooms below
receive them as arguments and never read gin."""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

from t5x_like import checks
from t5x_like.checkpoint import store
from t5x_like.data.sources import SourceSettings
from t5x_like.errors import UserError
from t5x_like.eval.harness.during_training import LmEvalDuringTraining
from t5x_like.experiment import ExperimentSettings
from t5x_like.run.validation import ALL_BATCHES


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopSettings:
    """A run's lengths, cadences and policies (gin: train.*). Trains `train_steps` steps (TRAIN_STEPS), resuming from
    MODEL_DIR's newest intact checkpoint; checkpoints every `checkpoint_every` steps and at `save_steps` (Pythia's
    log-spaced ones; 0 saves the initial state), keeping the newest `keep_checkpoints` (None: every one) and every
    save step; validates every `eval_every` steps (0: never) on `eval_steps` batches (-1: the whole split); starts
    from RESTORE_FROM's parameters when MODEL_DIR has no checkpoint. TensorBoard's events go to `tensorboard_dir`
    (default MODEL_DIR/tensorboard; Megatron's --tensorboard-dir). A damaged checkpoint is skipped for the previous
    one (`on_corrupt_checkpoint` 'fallback', logged loudly) or stops the run ('stop'). A run stops after
    `nonfinite_in_a_row` skipped non-finite steps in a row. A resume continues the data where the checkpoint left it
    and refuses data other than the checkpoint's; `restart_data` starts the data over instead."""

    model_dir: str | None
    train_steps: int | None
    checkpoint_every: int = 1000
    keep_checkpoints: int | None = 3
    save_steps: Sequence[int] = ()
    eval_every: int = 0
    eval_steps: int = 20
    restore_from: str | None = None
    log_every: int = 10
    tensorboard_dir: str | None = None
    on_corrupt_checkpoint: str = "fallback"
    nonfinite_in_a_row: int = 5
    restart_data: bool = False

    def check(self) -> None:
        """The settings other than MODEL_DIR in range (--print_config needs no MODEL_DIR; check_model_dir checks
        it when there is one)."""
        checks.non_negative_int("TRAIN_STEPS", self.train_steps)
        checks.positive_int("CHECKPOINT_EVERY", self.checkpoint_every)
        if self.keep_checkpoints is not None:
            checks.positive_int("train.keep_checkpoints", self.keep_checkpoints, fix="or None to keep every checkpoint")
        if isinstance(self.save_steps, (str, int)):
            raise UserError(f"train.save_steps={self.save_steps!r}: expected a list of steps, e.g. [0, 1, 2, 4, 8].")
        for step in self.save_steps:
            checks.non_negative_int("train.save_steps", step, fix="a list of steps, e.g. [0, 1, 2, 4, 8]")
        if self.tensorboard_dir is not None:
            check_path_setting("train.tensorboard_dir", self.tensorboard_dir, "or None for MODEL_DIR/tensorboard")
            checks.writable_dir("train.tensorboard_dir", self.tensorboard_dir)
        checks.non_negative_int("EVAL_EVERY", self.eval_every, fix="0 = no periodic validation")
        if self.eval_steps != ALL_BATCHES:
            checks.positive_int("EVAL_STEPS", self.eval_steps, fix=f"or {ALL_BATCHES} for the whole validation split")
        checks.positive_int("train.log_every", self.log_every)
        checks.positive_int("train.nonfinite_in_a_row", self.nonfinite_in_a_row)
        checks.one_of("train.on_corrupt_checkpoint", self.on_corrupt_checkpoint, store.ON_CORRUPT)
        if self.restore_from is not None:
            check_path_setting("RESTORE_FROM", self.restore_from)


def check_path_setting(name: str, value, fix: str = "") -> None:
    """A path setting: a non-empty string."""
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{name}={value!r}: expected a path in quotes, e.g. --gin.{name}=\"'/runs/run1'\""
                        f"{' ' + fix if fix else ''}.")


def check_model_dir(model_dir) -> None:
    """MODEL_DIR a path this process can write in (or create)."""
    check_path_setting("MODEL_DIR", model_dir)
    checks.writable_dir("MODEL_DIR", model_dir)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSettings:
    """Everything a training run is made of: the loop's settings, the experiment's (model, mesh, optimizer, batch),
    the data's, lm-eval's during training, and the configuration texts MODEL_DIR records: `config_text` (the files
    and bindings as given: config.gin) and `operative_config` (every setting, defaults included:
    operative_config.gin, --print_config) and `bindings` (each binding as written, by name: what the processes of a
    job compare before step 1). `model_chosen`: the model was chosen after the run file (a later
    --gin_file, --gin.model_config.preset), so a RESTORE_FROM checkpoint of another family is refused rather than
    taken (as `from_pretrained` would); `unset`: required macros --print_config left None (MODEL_DIR, the data's)."""

    loop: LoopSettings
    experiment: ExperimentSettings
    source: SourceSettings = SourceSettings()
    lm_eval: LmEvalDuringTraining = LmEvalDuringTraining()
    config_text: str = ""
    operative_config: str = ""
    bindings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    model_chosen: bool = False
    unset: tuple[str, ...] = ()
