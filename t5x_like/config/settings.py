"""A run's settings, made once from the parsed gin configuration (frontend.parse_gin, after EPOCHS) by calling the
settings each run file configures (configurables.py), and handed to the command, which passes them down: the rooms
below never read gin."""
from __future__ import annotations

from t5x_like.config import bindings, configurables, operative
from t5x_like.run.epochs import Batches
from t5x_like.run.settings import RunSettings


def read_batches() -> Batches:
    """What EPOCHS counts a pass's steps with, as gin binds it now (before gin.finalize())."""
    experiment = bindings.arguments("build_experiment", "batch_size", "feature_lengths", "seed", "batch_size_rampup")
    return Batches(source=configurables.source_settings(), **experiment)


def read_run_settings(unset: tuple[str, ...] = (), *, model_chosen: bool = False) -> RunSettings:
    """The run's settings from the parsed (finalized) gin configuration; `unset`: the required macros left None;
    `model_chosen`: see RunSettings."""
    return RunSettings(loop=configurables.loop_settings(), experiment=configurables.experiment_settings(),
                       source=configurables.source_settings(), lm_eval=configurables.lm_eval_settings(),
                       config_text=bindings.config_text(),
                       operative_config=operative.operative_config_str(configurables.ROOTS),
                       bindings=bindings.every_binding(), model_chosen=model_chosen, unset=unset)
