"""A run's configuration from gin: the library functions run files configure (registered here; the front-end's
register_configurables imports this module), the model config (`model_config`), the checks of the data settings
that need no data, and build_experiment on a mesh other than the one the run files describe (compile's)."""
from __future__ import annotations

import gin
from jax.sharding import Mesh

import configs
import models
from partitioning import make_mesh
from t5x_like import checks, data, optim, step_fns
from t5x_like.checkpoint import store
from t5x_like.cluster import agreement, peers
from t5x_like.config import bindings
from t5x_like.data import loader
from t5x_like.errors import UserError
from t5x_like.experiment import Experiment, build_experiment
from t5x_like.lm import check_objective

gin.external_configurable(make_mesh, module="partitioning")
gin.external_configurable(optim.make_optimizer, module="optim")
gin.external_configurable(step_fns.LossScaleConfig, module="trainer")
make_source = gin.external_configurable(data.make_source, module="data", denylist=["rampup", "pair_ends"])  # train() gives them


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
    check_objective(config, bindings.bound(make_source, "objective").get("objective", "causal_lm"))
    return config


def run_vocab_size() -> int:
    """The vocabulary size of the tokenizer data.make_source's bindings select."""
    bound = bindings.bound(make_source)
    return data.tokenizer_vocab_size(data_path=bound.get("data_path"), tokenizer=bound.get("tokenizer"),
                                     tfds_name=bound.get("tfds_name"), objective=bound.get("objective", "causal_lm"))


def check_data_settings(settings: dict) -> None:
    """What --print_config can check of the data settings without opening the data (training checks the rest)."""
    loader.split_documents(settings["data_split"], 1000, "train", "DATA_SPLIT")
    if not isinstance(settings["packing"], bool):
        raise UserError(f"PACKING={settings['packing']!r}: expected True or False (no quotes).")
    paths, weights = settings.get("data_path"), settings.get("blend_weights")
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


def agree_on_settings(latest: int | None) -> None:
    """Several processes: each one's settings, data files and checkpoint step must be process 0's."""
    if not peers.active():
        return
    bound = bindings.bound(make_source)
    agreement.agree(agreement.run_facts(latest, [bound.get("data_path"), bound.get("tokenizer")],
                                        bindings.every_binding()))


def experiment_on(mesh: Mesh) -> Experiment:
    """build_experiment() as the run files set it up, over `mesh` (compile's target devices) instead of the mesh
    they build on this machine's devices."""
    bindings.rebind("build_experiment.mesh", mesh)  # gin evaluates every binding of a call, even one passed
    return build_experiment()
