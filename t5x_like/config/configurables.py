"""A run's configuration from gin: the settings run files configure, each registered under the name run files
write (`train.*`, `build_experiment.*`, `data.make_source.*`, `optim.make_optimizer.*`, `partitioning.make_mesh.*`,
`trainer.LossScaleConfig.*`, `lm_eval_during_training.*`; importing this module registers them), the model config
(`model_config`), and the checks of the data settings that need no data. Calling a registered name gives its typed
settings, which the rooms below take as arguments."""
from __future__ import annotations

import gin

import configs
import models
from partitioning import MeshShape
from t5x_like import checks, data, optim, step_fns
from t5x_like.checkpoint import store
from t5x_like.data import loader
from t5x_like.errors import UserError
from t5x_like.eval.harness.during_training import LmEvalDuringTraining
from t5x_like.experiment import ExperimentSettings
from t5x_like.lm import check_objective
from t5x_like.run.settings import LoopSettings

mesh_shape = gin.external_configurable(MeshShape, name="make_mesh", module="partitioning")
optimizer_settings = gin.external_configurable(optim.OptimizerSettings, name="make_optimizer", module="optim")
gin.external_configurable(step_fns.LossScaleConfig, module="trainer")
source_settings = gin.external_configurable(data.SourceSettings, name="make_source", module="data")
experiment_settings = gin.external_configurable(ExperimentSettings, name="build_experiment")
loop_settings = gin.external_configurable(LoopSettings, name="train")
lm_eval_settings = gin.external_configurable(LmEvalDuringTraining, name="lm_eval_during_training")
ROOTS = ("train", "data.make_source", "build_experiment")
"""The settings a run reads, in the order --print_config and operative_config.gin list them (with what they
reference: model_config, partitioning.make_mesh, optim.make_optimizer, trainer.LossScaleConfig)."""


@gin.configurable
def model_config(preset: str = gin.REQUIRED, *, vocab_from_tokenizer: bool = False, dtype: str = "bfloat16",
                 attention: str = "auto", remat_policy: str = "none", scan_layers: bool = True,
                 matmul_dtype: str | None = None, overrides: dict | None = None):
    """A model config: the named preset (configs/), then the run's choices and overrides.

    `vocab_from_tokenizer`: the vocabulary is the run's tokenizer's (data.make_source's TOKENIZER, or the
    one its DATA_PATH files were made with, or the builtin corpus's), so any corpus trains the model.
    `overrides` set config fields; on the command line they merge key by key into the files' overrides.
    """
    values = dict(configs.get_model_config(preset).to_dict())
    if vocab_from_tokenizer:
        values["vocab_size"] = run_vocab_size()
    values.update(dtype=dtype, attention=attention, remat_policy=remat_policy, scan_layers=scan_layers,
                  matmul_dtype=matmul_dtype)
    values.update(overrides or {})
    try:
        config = models.config_from_dict(values)
    except ValueError as e:
        raise UserError(f"model_config (preset {preset!r}, overrides {overrides}): {e}") from None
    negative = {k: v for k, v in config.architecture().items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0}
    if negative:
        raise UserError(f"model_config (preset {preset!r}, overrides {overrides}): {negative} must not be negative; "
                        "fix model_config.overrides.")
    check_objective(config, source_settings().objective)
    return config


def run_vocab_size() -> int:
    """The vocabulary size of the tokenizer data.make_source's bindings select."""
    source = source_settings()
    return data.tokenizer_vocab_size(data_path=source.data_path, tokenizer=source.tokenizer,
                                     tfds_name=source.options.get("tfds_name"), objective=source.objective)


def check_data_settings(source: data.SourceSettings) -> None:
    """What --print_config can check of the data settings without opening the data (training checks the rest)."""
    loader.split_documents(source.data_split, 1000, "train", "DATA_SPLIT")
    if not isinstance(source.packing, bool):
        raise UserError(f"PACKING={source.packing!r}: expected True or False (no quotes).")
    paths, weights = source.data_path, source.blend_weights
    count = len(paths) if isinstance(paths, (list, tuple)) else 1 if paths else 0
    if weights is not None and (not isinstance(weights, (list, tuple)) or len(weights) != count):
        raise UserError(f"BLEND_WEIGHTS={weights!r}: give one weight per DATA_PATH prefix ({count} given), or leave "
                        "it None.")
    for weight in weights or ():
        checks.finite_float("BLEND_WEIGHTS", weight, minimum=0.0, exclusive_minimum=True)


def has_checkpoint(model_dir: str) -> bool:
    try:
        store.locate(model_dir)
    except FileNotFoundError:
        return False
    return True


def restored_config(checkpoint: str) -> models.FamilyConfig:
    """The model config a checkpoint (MODEL_DIR or step directory) records."""
    return models.config_from_dict(store.read_model_info(checkpoint)["config"])
