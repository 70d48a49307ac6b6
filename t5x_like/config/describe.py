"""`train --print_config`: every effective setting of a run, its model and its learning-rate schedule, checked as
training checks them, with nothing initialised, compiled or written (MODEL_DIR may be unset)."""
from __future__ import annotations

import dataclasses

import jax

from partitioning import PartitioningError, make_mesh
from t5x_like import data, experiment, optim
from t5x_like.config import bindings
from t5x_like.config.configurables import (check_data_settings, has_checkpoint, make_source, restored_config,
                                           run_vocab_size)
from t5x_like.config.settings import RunSettings
from t5x_like.errors import UserError
from t5x_like.experiment import build_experiment
from t5x_like.lm import make_lm
from t5x_like.run.loop import check_model_dir, check_settings, train


def describe_run(settings: RunSettings) -> str:
    """Every effective setting (gin text, defaults included), the model and the learning-rate schedule, checked by
    assembling the experiment as train() does (nothing is initialised or compiled); reads MODEL_DIR's checkpoint,
    if any, and writes nothing. MODEL_DIR may be None (unset). A mesh this machine's devices cannot hold (a pod's
    configuration on a workstation) is reported, not checked."""
    bound = bindings.arguments(train)
    check_settings(**bound)
    check_data_settings(bindings.arguments(make_source))
    model_dir, restore_from = bound["model_dir"], bound.get("restore_from")
    if model_dir is not None:
        check_model_dir(model_dir)
    resuming = model_dir is not None and has_checkpoint(model_dir)
    restored_from = model_dir if resuming else restore_from
    restored = restored_config(restored_from) if restored_from else None
    mesh_sizes = settings.mesh_sizes
    try:
        mesh = make_mesh(**mesh_sizes)
    except PartitioningError as e:
        mesh, mesh_note = None, str(e)
    if mesh is not None:
        exp = build_experiment(mesh=mesh, restored=restored, resuming=resuming,
                               adopt_architecture=experiment.takes_checkpoint_architecture(resuming, restore_from))
        config, num_params = exp.config, exp.num_params
        mesh_line = f"#   mesh {dict(mesh.shape)}, rules {exp.partitioner.rules.name!r}"
    else:
        model = bindings.bound("build_experiment", "model")["model"]
        config = experiment.resolve_model_config(
            model, max(mesh_sizes.get("tensor", 1), 1), restored, resuming=resuming,
            adopt_architecture=experiment.takes_checkpoint_architecture(resuming, restore_from))
        num_params = make_lm(config).num_params()
        mesh_line = (f"#   mesh not checked on this machine's {jax.device_count()} devices ({mesh_note}); "
                     "`python -m t5x_like.compile --topology=...` checks it for the target")
    lines = [f"# Model: {config.summary()}", f"#   {num_params:,} parameters", vocabulary_line(config.vocab_size),
             mesh_line]
    if restored_from:
        lines.append(f"#   {'resumes from' if resuming else 'parameters from'} {restored_from}")
    if model_dir is None:
        lines.append("#   MODEL_DIR unset: training needs it (--gin.MODEL_DIR=\"'runs/NAME'\")")
    lines.append("#   resolved model config (preset, model_config choices and overrides merged):")
    lines += [f"#     {k} = {v!r}" for k, v in dataclasses.asdict(config).items()]
    lines.append(f"# Schedule: {optim.describe_schedule(**bindings.arguments(optim.make_optimizer))}")
    return settings.operative_config + "\n" + "\n".join(lines) + "\n"


def vocabulary_line(model_vocab_size: int) -> str:
    """The data's vocabulary against the model's, refused as training refuses it when the model's is smaller; read
    from TOKENIZER, or from the tokenizer the token files' P.json names (no data is read). Data this machine cannot
    read (a cluster's paths) is reported, not checked."""
    settings = bindings.bound(make_source)
    tokenizer = settings.get("tokenizer") or (f"the one DATA_PATH={settings['data_path']!r} was made with"
                                              if settings.get("data_path") else "the builtin corpus's")
    try:
        size = run_vocab_size()
    except UserError as e:
        return f"#   vocabulary not checked against the data's tokenizer: {e}"
    data.check_model_vocabulary(model_vocab_size, size, tokenizer)
    return f"#   vocabulary: {model_vocab_size:,} ids hold the {size:,} of the data's tokenizer ({tokenizer})"
