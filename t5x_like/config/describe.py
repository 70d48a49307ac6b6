"""`train --print_config`: every effective setting of a run, its model and its learning-rate schedule, checked as
training checks them, with nothing initialised, compiled or written (MODEL_DIR may be unset)."""
from __future__ import annotations

import dataclasses

import jax

import models
from partitioning import PartitioningError
from t5x_like import data, experiment, optim
from t5x_like.config import bindings
from t5x_like.config.configurables import check_data_settings, has_checkpoint, restored_config, run_vocab_size
from t5x_like.errors import UserError
from t5x_like.lm import make_lm
from t5x_like.run.settings import RunSettings, check_model_dir

UNSET_EXAMPLES = {"MODEL_DIR": "runs/NAME", "DATA_PATH": "data/NAME_text_document"}


def describe_run(settings: RunSettings) -> str:
    """Every effective setting (gin text, defaults included), the model and the learning-rate schedule, checked by
    assembling the experiment as train() does (nothing is initialised or compiled); reads MODEL_DIR's checkpoint,
    if any, and writes nothing. MODEL_DIR may be None (unset). A mesh this machine's devices cannot hold (a pod's
    configuration on a workstation) is reported, not checked. The data is not opened: with DATA_PATH unset, EPOCHS
    leaves TRAIN_STEPS to training."""
    loop = settings.loop
    uncounted = loop.train_steps is None and bindings.macro("EPOCHS") is not None
    (dataclasses.replace(loop, train_steps=0, checkpoint_every=1, eval_every=0) if uncounted else loop).check()
    check_data_settings(settings.source)
    if loop.model_dir is not None:
        check_model_dir(loop.model_dir)
    resuming = loop.model_dir is not None and has_checkpoint(loop.model_dir)
    restored_from = loop.model_dir if resuming else loop.restore_from
    start = experiment.restored(restored_config(restored_from) if restored_from else None, resuming=resuming,
                                restore_from=loop.restore_from, adopt_family=not settings.model_chosen)
    config, lines = assembled(settings, start)
    lines.insert(2, vocabulary_line(config.vocab_size, settings))
    if restored_from:
        lines.append(f"#   {'resumes from' if resuming else 'parameters from'} {restored_from}")
    lines += [f"#   {name} unset: training needs it (--gin.{name}=\"'{UNSET_EXAMPLES.get(name, '...')}'\")"
              for name in settings.unset]
    lines.append("#   resolved model config (preset, model_config choices and overrides merged):")
    lines += [f"#     {k} = {v!r}" for k, v in dataclasses.asdict(config).items()]
    schedule = (f"EPOCHS={bindings.macro('EPOCHS')} passes, whose steps training counts from the data" if uncounted
                else optim.describe_schedule(settings.experiment.optimizer, loop.train_steps))
    lines.append(f"# Schedule: {schedule}")
    return settings.operative_config + "\n" + "\n".join(lines) + "\n"


def assembled(settings: RunSettings, start: experiment.Restored | None) -> tuple[models.FamilyConfig, list[str]]:
    """The run's model config, and the lines on its model, mesh and batch: the experiment assembled as train()
    assembles it, or, for a mesh this machine cannot hold, the model alone."""
    shape = settings.experiment.mesh
    try:
        mesh = shape.build()
    except PartitioningError as e:
        config = experiment.resolve_model_config(settings.experiment.model, max(shape.tensor, 1), start)
        return config, [f"# Model: {config.summary()}", f"#   {make_lm(config).num_params():,} parameters",
                        f"#   mesh not checked on this machine's {jax.device_count()} devices ({e}); "
                        "`python -m t5x_like.compile --topology=...` checks it for the target"]
    exp = experiment.build_experiment(settings.experiment, train_steps=settings.loop.train_steps or 0,
                                      restored=start, mesh=mesh)
    accumulated = exp.step_config.grad_accum_steps
    return exp.config, [f"# Model: {exp.config.summary()}", f"#   {exp.num_params:,} parameters",
                        f"#   mesh {dict(mesh.shape)}, rules {exp.partitioner.rules.name!r}",
                        f"#   batch {exp.batch_size} rows a step: {accumulated} accumulated microbatch"
                        f"{'es' if accumulated > 1 else ''} of {exp.batch_size // accumulated} rows over "
                        f"{exp.partitioner.batch_shards} data-parallel shards"]


def vocabulary_line(model_vocab_size: int, settings: RunSettings) -> str:
    """The data's vocabulary against the model's, refused as training refuses it when the model's is smaller; read
    from TOKENIZER, or from the tokenizer the token files' P.json names (no data is read). Data this machine cannot
    read (a cluster's paths), or left unset (the macros --print_config leaves None), is reported, not checked."""
    if unset_data := [name for name in settings.unset if name != "MODEL_DIR"]:
        return f"#   vocabulary not checked against the data's tokenizer: {', '.join(unset_data)} unset"
    source = settings.source
    tokenizer = source.tokenizer or (f"the one DATA_PATH={source.data_path!r} was made with"
                                     if source.data_path else "the builtin corpus's")
    try:
        size = run_vocab_size()
    except UserError as e:
        return f"#   vocabulary not checked against the data's tokenizer: {e}"
    data.check_model_vocabulary(model_vocab_size, size, tokenizer)
    return f"#   vocabulary: {model_vocab_size:,} ids hold the {size:,} of the data's tokenizer ({tokenizer})"
