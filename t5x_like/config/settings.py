"""A run's settings, resolved once from gin at the edge (frontend.parse_gin, after EPOCHS) and passed down to the
code that needs them (run/directory.py's config records, run/epochs.py, compile's mesh), which never reads gin."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from t5x_like.config import bindings, operative


@dataclasses.dataclass(frozen=True)
class DataSettings:
    """What the training data is read with: build_experiment's batch and lengths, and data.make_source's
    bindings (DATA_PATH, TOKENIZER, DATA_SPLIT, OBJECTIVE, ...)."""

    batch_size: int
    feature_lengths: Mapping[str, int]
    seed: int
    batch_size_rampup: tuple[int, int, int] | None
    source: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """A parsed run: its data, its lengths (EPOCHS resolved into TRAIN_STEPS, CHECKPOINT_EVERY and EVAL_EVERY),
    the mesh's axis sizes (partitioning.make_mesh's bindings), and the config texts MODEL_DIR records."""

    data: DataSettings
    train_steps: int | None
    checkpoint_every: int
    eval_every: int
    mesh_sizes: Mapping[str, int]
    config_text: str
    """The files and bindings as given (MODEL_DIR/config.gin)."""
    operative_config: str
    """Every setting `train` uses, defaults included (MODEL_DIR/operative_config.gin, --print_config)."""
    model_chosen: bool = False
    """Whether the model preset was chosen after the run file (a later --gin_file, --gin.model_config.preset): a
    RESTORE_FROM checkpoint of another family is then refused; otherwise its architecture, family included,
    replaces the run file's model (as `from_pretrained` does)."""
    unset: tuple[str, ...] = ()
    """Required macros --print_config leaves unset (None): MODEL_DIR and the data's, which training needs."""


def read_data_settings() -> DataSettings:
    """The data settings gin binds now (before gin.finalize() too: EPOCHS counts the training split with them)."""
    experiment = bindings.arguments("build_experiment", "batch_size", "feature_lengths", "seed", "batch_size_rampup")
    return DataSettings(batch_size=experiment["batch_size"], feature_lengths=experiment["feature_lengths"],
                        seed=experiment["seed"], batch_size_rampup=experiment["batch_size_rampup"],
                        source=bindings.bound("data.make_source"))


def read_run_settings(unset: tuple[str, ...] = (), *, model_chosen: bool = False) -> RunSettings:
    """The run's settings from the parsed (finalized) gin configuration; `unset`: the required macros left None;
    `model_chosen`: see RunSettings."""
    lengths = bindings.arguments("train", "train_steps", "checkpoint_every", "eval_every")
    return RunSettings(data=read_data_settings(), mesh_sizes=bindings.bound("partitioning.make_mesh"),
                       config_text=bindings.config_text(), operative_config=operative.operative_config_str("train"),
                       unset=unset, model_chosen=model_chosen, **lengths)
