"""`build_experiment()`: the one place a run is assembled.

From its ExperimentSettings (a model config, a mesh, a rule set, an optimizer and the batch settings) it builds the
Partitioner, the LanguageModel (pipelined when PIPELINE_PARALLEL > 1), the train state's abstract shape and
shardings, and the jitted train and eval steps. train, compile, the benchmarks and the tests all call it; the gin
front-end (t5x_like/config/) makes the settings from a run's `build_experiment.*` bindings.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh

import models
from partitioning import MeshShape, Partitioner, pipeline
from t5x_like import checks, optim, step_fns
from t5x_like.cluster import processes
from t5x_like.data.rampup import BatchRampup, batch_rampup
from t5x_like.errors import UserError, as_user_error
from t5x_like.lm import LanguageModel, make_lm

NONFINITE_POLICIES = ("stop", "skip")


@dataclasses.dataclass
class Experiment:
    """Everything a run needs besides data and a directory."""

    config: models.FamilyConfig
    lm: LanguageModel
    partitioner: Partitioner
    optimizer: optim.Optimizer
    step_config: step_fns.StepConfig
    batch_size: int
    lengths: dict[str, int]
    seed: int
    on_nonfinite: str
    abstract_state: step_fns.TrainState  # boxed ShapeDtypeStructs (logical names kept)
    shardings: step_fns.TrainState  # NamedShardings
    rampup: BatchRampup | None = None  # BATCH_SIZE_RAMPUP: steps train on fewer rows than batch_size at first

    @property
    def mesh(self) -> Mesh:
        return self.partitioner.mesh

    @property
    def batch_sharding(self):
        return self.partitioner.batch_sharding()

    @functools.cached_property
    def num_params(self) -> int:
        return self.lm.num_params()

    @property
    def flops_per_step(self) -> float:
        return self.lm.flops_per_step(self.lengths, self.batch_size)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * sum(self.lengths.values())

    def rows_trained(self, first: int, last: int) -> int:
        """The rows steps `first` .. `last` - 1 (from 0) train on: batch_size each, fewer during a batch-size
        ramp-up (such a step still computes batch_size rows; the others count nothing)."""
        if self.rampup is None:
            return (last - first) * self.batch_size
        return self.rampup.consumed_before(last) - self.rampup.consumed_before(first)

    def _init(self, rng: jax.Array) -> step_fns.TrainState:
        return step_fns.init_train_state(self.lm, self.optimizer.tx, rng, self.lengths, self.step_config.loss_scale)

    def init_state(self) -> step_fns.TrainState:
        """A fresh state, initialised sharded in place from SEED."""
        with self.partitioner.activate():
            return self.partitioner.initialize(self._init, jax.random.PRNGKey(self.seed), self.shardings)

    def sharded_abstract_state(self) -> step_fns.TrainState:
        """ShapeDtypeStructs of the state carrying their shardings (to restore or compile against)."""
        return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                            nn.meta.unbox(self.abstract_state), self.shardings)

    def abstract_batch(self, *, packed: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
        """One global batch's features, with the batch sharding."""
        return {k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=self.batch_sharding)
                for k, s in self.lm.batch_spec(self.lengths, self.batch_size, packed=packed).items()}

    @functools.cached_property
    def train_step(self) -> Callable[[step_fns.TrainState, dict], tuple[step_fns.TrainState, dict]]:
        """The train step, jitted with the state's and the batch's shardings, donating the old state."""
        step = step_fns.make_train_step(self.lm, self.optimizer.tx, self.optimizer.schedule, self.step_config)
        return self.partitioner.partition(step, (self.shardings, self.batch_sharding),
                                          (self.shardings, self.partitioner.replicated), donate_argnums=(0,))

    @functools.cached_property
    def eval_step(self) -> Callable[[Any, dict], dict]:
        step = step_fns.make_eval_step(self.lm, self.step_config.grad_accum_steps)
        return self.partitioner.partition(step, (self.shardings.params, self.batch_sharding),
                                          self.partitioner.replicated)

    @functools.cached_property
    def host_layout(self) -> tuple[int, int]:
        """(index, count): this process loads part `index` of `count` of every global batch (the mesh
        decides; processes holding the same rows load the same part). Computed once per run."""
        return self.partitioner.host_batch_layout(self.batch_size)

    @property
    def host_batch_size(self) -> int:
        return self.batch_size // self.host_layout[1]

    def global_batch(self, local: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        """This host's rows (part `host_layout` of the batch) -> global arrays laid out over the devices."""
        return global_batch(local, self.batch_sharding, self.batch_size)


def global_batch(local: Mapping[str, np.ndarray], sharding, global_rows: int) -> dict[str, jax.Array]:
    """This host's rows -> global arrays of `global_rows` rows laid out as `sharding` (the rows go to this
    process's devices in order; replicas across processes must pass the same rows)."""
    arrays = {k: np.asarray(v) for k, v in local.items()}
    return {k: jax.make_array_from_process_local_data(sharding, v, (global_rows, *v.shape[1:]))
            for k, v in arrays.items()}


@dataclasses.dataclass(frozen=True, kw_only=True)
class ExperimentSettings:
    """What a run is assembled from (gin: build_experiment.*): the model config, the mesh's shape (or a Mesh, for
    code that builds its own: compile's target devices), the rule set, the optimizer, the batch (BATCH_SIZE rows of
    FEATURE_LENGTHS; BATCH_SIZE_RAMPUP, Megatron's (start, increment, samples) ramp-up, data/rampup.py), SEED, the
    microbatches (GRAD_ACCUM_STEPS, or MICRO_BATCH_SIZE rows per data-parallel shard, from which accumulation()
    derives them on the mesh; NUM_MICROBATCHES and PIPELINE_REPEATS of a pipeline), the loss (z_loss, the float16
    loss scale, CROSS_ENTROPY and its chunk), the non-finite policy and the optimizer state's offload."""

    model: models.FamilyConfig
    mesh: MeshShape | Mesh
    rules: str = "fsdp_tensor"
    optimizer: optim.OptimizerSettings
    batch_size: int
    feature_lengths: Mapping[str, int]
    batch_size_rampup: tuple[int, int, int] | None = None
    seed: int = 0
    grad_accum_steps: int = 1
    micro_batch_size: int | None = None
    z_loss: float = 0.0
    loss_scale: step_fns.LossScaleConfig = step_fns.LossScaleConfig()
    on_nonfinite: str = "stop"
    cross_entropy: str = "chunked"
    loss_chunk_size: int = 256
    offload_optimizer_state: bool = False
    pipeline_microbatches: int = 1
    pipeline_repeats: int = 1


@dataclasses.dataclass(frozen=True)
class Restored:
    """The checkpoint a run starts from: its model `config`, and whether the run resumes it (`resuming`: MODEL_DIR's)
    or takes its architecture (`adopt_architecture`: a RESTORE_FROM run, started or resumed; `adopt_family`: of
    another family too, when the model is the run file's own)."""

    config: models.FamilyConfig
    adopt_architecture: bool = False
    adopt_family: bool = False
    resuming: bool = False


def build_experiment(settings: ExperimentSettings, *, train_steps: int, restored: Restored | None = None,
                     mesh: Mesh | None = None) -> Experiment:
    """Assemble a run of `train_steps` steps (the optimizer's schedule) from `settings`, on `mesh` when given (else
    the settings' mesh). The model must have `restored`'s architecture (or takes it, see Restored), and keeps its
    vocabulary padding where it divides."""
    s = settings
    check_step_settings(s.on_nonfinite, s.batch_size, s.grad_accum_steps, s.loss_chunk_size, s.seed)
    rampup = batch_rampup(s.batch_size_rampup, s.batch_size)
    lengths = check_lengths(s.feature_lengths)
    mesh = mesh or (s.mesh if isinstance(s.mesh, Mesh) else s.mesh.build())
    partitioner = Partitioner(mesh, s.rules)
    grad_accum_steps, microbatches = accumulation(s.batch_size, s.micro_batch_size, s.grad_accum_steps,
                                                  s.pipeline_microbatches, partitioner)
    check_batch(s.batch_size, grad_accum_steps, partitioner)
    config = resolve_model_config(s.model, mesh.shape["tensor"], restored)
    with as_user_error():
        config.check_lengths(lengths)
    step_config = step_fns.StepConfig(
        grad_accum_steps=grad_accum_steps, z_loss=s.z_loss, loss_scale=s.loss_scale if config.dtype == "float16" else
        None, cross_entropy=s.cross_entropy, loss_chunk_size=s.loss_chunk_size,
        offload_optimizer_state=s.offload_optimizer_state)
    lm = make_lm(config, layer_stack_of(config, mesh, microbatches, s.pipeline_repeats,
                                         s.batch_size // grad_accum_steps, partitioner))
    experiment = Experiment(config=config, lm=lm, partitioner=partitioner,
                            optimizer=optim.make_optimizer(s.optimizer, train_steps), step_config=step_config,
                            batch_size=s.batch_size, lengths=lengths, seed=s.seed, on_nonfinite=s.on_nonfinite,
                            abstract_state=None, shardings=None, rampup=rampup)
    with partitioner.activate():
        offload = ("opt_state",) if s.offload_optimizer_state else ()
        experiment.abstract_state, experiment.shardings = partitioner.abstract_and_shardings(
            lambda: experiment._init(jax.random.PRNGKey(s.seed)), offload)
    if processes.is_primary():
        log_layout(experiment)
    return experiment


def layer_stack_of(config: models.FamilyConfig, mesh: Mesh, microbatches: int, repeats: int, rows: int,
                   partitioner: Partitioner) -> Callable | None:
    """The pipelined layer stack of PIPELINE_PARALLEL > 1 (pipeline_stack), refusing FP8 under a pipeline."""
    with as_user_error():
        layer_stack = pipeline_stack(config, mesh.shape["stage"], microbatches, repeats, rows,
                                     partitioner.batch_shards, partitioner.batch_macros)
    if layer_stack is not None and config.matmul_dtype == "fp8":
        raise UserError("model_config.matmul_dtype='fp8' does not run pipelined yet (the pipeline carries no FP8 "
                        "state): set PIPELINE_PARALLEL=1, or drop matmul_dtype.")
    return layer_stack


def check_step_settings(on_nonfinite: str, batch_size: int, grad_accum_steps: int, loss_chunk_size: int,
                        seed: int) -> None:
    if on_nonfinite not in NONFINITE_POLICIES:
        raise UserError(f"build_experiment.on_nonfinite={on_nonfinite!r}: choose one of {NONFINITE_POLICIES}.")
    checks.positive_int("BATCH_SIZE", batch_size)
    checks.positive_int("GRAD_ACCUM_STEPS", grad_accum_steps)
    checks.positive_int("build_experiment.loss_chunk_size", loss_chunk_size)
    checks.integer("SEED", seed)


def log_layout(experiment: Experiment) -> None:
    """The parameters' layout over the mesh, the model, and the batch-size ramp-up, if any."""
    params = experiment.abstract_state.params
    logging.info("parameter layout:\n%s", experiment.partitioner.describe(params, nn.get_partition_spec(params)))
    logging.info("model: %s; %s parameters", experiment.config.summary(), f"{experiment.num_params:,}")
    if experiment.rampup is not None:
        logging.info("batch size: %s", experiment.rampup.describe())


def check_lengths(feature_lengths: Mapping[str, int]) -> dict[str, int]:
    """FEATURE_LENGTHS as plain ints, each set and positive."""
    lengths = dict(feature_lengths)
    for name, value in lengths.items():
        if value is None:
            raise UserError(f"FEATURE_LENGTHS[{name!r}] is not set: set SEQ_LEN (decoder-only models) or "
                            "FEATURE_LENGTHS, e.g. --gin.SEQ_LEN=1024.")
        if not isinstance(value, int) or value < 1:
            raise UserError(f"FEATURE_LENGTHS[{name!r}]={value!r}: lengths are positive integers.")
    return lengths


def accumulation(batch_size: int, micro_batch_size: int | None, grad_accum_steps: int, pipeline_microbatches: int,
                 partitioner: Partitioner) -> tuple[int, int]:
    """(GRAD_ACCUM_STEPS, NUM_MICROBATCHES): as given, or derived from MICRO_BATCH_SIZE (Megatron-LM's
    --micro-batch-size: rows per data-parallel shard in one microbatch) and the mesh, as Megatron derives them:
    BATCH_SIZE = MICRO_BATCH_SIZE x data-parallel shards x microbatches, accumulated (with a pipeline: its
    microbatches). Where the shards hold fewer rows than MICRO_BATCH_SIZE (more devices than upstream had), or a
    number it does not divide, a microbatch takes the most rows up to MICRO_BATCH_SIZE that divide them. The same
    global batch trains on any number of devices."""
    if micro_batch_size is None:
        return grad_accum_steps, pipeline_microbatches
    checks.positive_int("MICRO_BATCH_SIZE", micro_batch_size, fix="or None to set GRAD_ACCUM_STEPS yourself")
    if grad_accum_steps != 1 or pipeline_microbatches != 1:
        raise UserError(f"MICRO_BATCH_SIZE={micro_batch_size} derives GRAD_ACCUM_STEPS (with a pipeline, "
                        f"NUM_MICROBATCHES) from the mesh, but GRAD_ACCUM_STEPS={grad_accum_steps} and NUM_MICROBATCHES="
                        f"{pipeline_microbatches} are set too: leave them at 1, or set MICRO_BATCH_SIZE=None.")
    shards = partitioner.batch_shards
    if batch_size % shards:
        raise UserError(f"BATCH_SIZE={batch_size} does not divide over the {shards} data-parallel shards "
                        f"({partitioner.batch_macros}); make it a multiple of {shards}, or change the mesh.")
    per_shard = batch_size // shards
    rows = max(d for d in range(1, min(micro_batch_size, per_shard) + 1) if per_shard % d == 0)
    count = per_shard // rows
    pipelined = partitioner.mesh.shape["stage"] > 1
    if processes.is_primary():
        logging.info("batch: BATCH_SIZE=%d = %d rows (MICRO_BATCH_SIZE=%d) x %d data-parallel shards x %d %s",
                     batch_size, rows, micro_batch_size, shards, count,
                     "pipeline microbatches" if pipelined else "accumulation steps")
    return (1, count) if pipelined else (count, 1)


def check_batch(batch_size: int, grad_accum_steps: int, partitioner: Partitioner) -> None:
    if batch_size % grad_accum_steps:
        raise UserError(f"BATCH_SIZE={batch_size} is not divisible by GRAD_ACCUM_STEPS={grad_accum_steps}.")
    micro, shards = batch_size // grad_accum_steps, partitioner.batch_shards
    if micro % shards:
        raise UserError(
            f"each microbatch has {micro} rows (BATCH_SIZE={batch_size} / GRAD_ACCUM_STEPS={grad_accum_steps}), "
            f"which does not divide over the {shards} data-parallel shards ({partitioner.batch_macros}). "
            f"Make BATCH_SIZE / GRAD_ACCUM_STEPS a multiple of {shards}, or set MICRO_BATCH_SIZE (rows per shard) "
            "to derive GRAD_ACCUM_STEPS from the mesh.")


def resolve_model_config(config: models.FamilyConfig, tensor: int,
                         start: Restored | None = None) -> models.FamilyConfig:
    """Pad the vocabulary to a multiple of 128 x tensor (the config's own multiple when it is one),
    unless a restored checkpoint fixes the padded size already (and it divides over the tensor axis).
    The checkpoint a run starts from (`start`) must hold the same architecture; with `adopt_architecture`
    (RESTORE_FROM: a run from a checkpoint's parameters, and its resumes) the model takes the checkpoint's instead,
    keeping the run's own choices (dtype, dropout, attention, remat, scan) and its head (HEAD_FIELDS: a classifier
    on a masked-LM encoder); with `adopt_family` (the run file's model, not one the user chose) a checkpoint of
    another family replaces it too, as `from_pretrained` does. A resumed checkpoint's FP8 state needs the run's
    matmul dtype to be its own."""
    if config.vocab_pad_multiple % (128 * tensor):
        config = dataclasses.replace(config, vocab_pad_multiple=128 * tensor)
    if start is None:
        return config
    restored, adopt_architecture = start.config, start.adopt_architecture
    check_family(restored, config, adopt_architecture=adopt_architecture, adopt_family=start.adopt_family)
    if start.resuming and restored.matmul_dtype != config.matmul_dtype:
        raise UserError(f"MODEL_DIR's checkpoint was trained with model_config.matmul_dtype={restored.matmul_dtype!r} "
                        f"but the run sets {config.matmul_dtype!r}: the FP8 state does not carry over a resume; keep "
                        f"{restored.matmul_dtype!r}, or start a new MODEL_DIR from its parameters with RESTORE_FROM.")
    saved, wanted = restored.architecture(), config.architecture()
    differ = {f: (saved.get(f), wanted.get(f)) for f in sorted(set(saved) | set(wanted))
              if saved.get(f) != wanted.get(f)}
    if differ and adopt_architecture:
        same_family = restored.family == config.family
        if same_family:
            logging.info("RESTORE_FROM: the model takes the checkpoint's architecture (%s)",
                         ", ".join(f"{f} {new} instead of {old}" for f, (new, old) in differ.items()))
        kept = restored.RUN_FIELDS + (restored.HEAD_FIELDS if same_family else ())
        config = dataclasses.replace(restored, **{f: getattr(config, f) for f in kept if hasattr(config, f)})
    elif differ:
        line = "{" + ", ".join(f"'{f}': {new!r}" for f, (new, _) in differ.items() if f in saved) + "}"
        raise UserError(f"MODEL_DIR's checkpoint holds a different model (checkpoint vs config: {differ}); to "
                        f"continue it add --gin.model_config.overrides=\"{line}\", or use a new MODEL_DIR.")
    if restored.padded_vocab_size % tensor == 0:
        config = dataclasses.replace(config, vocab_pad_multiple=restored.vocab_pad_multiple)
    return config


def check_family(restored: models.FamilyConfig, config: models.FamilyConfig, *, adopt_architecture: bool,
                 adopt_family: bool) -> None:
    """A checkpoint of another family than the run's model: taken by a RESTORE_FROM run whose model is the run
    file's (`adopt_family`) when it is of the same kind (the run file's objective and lengths are its kind's), else
    one line saying why not and the fix."""
    if restored.family == config.family:
        return
    kind, run_kind = (models.family_of(c).kind.replace("_", "-") for c in (restored, config))
    if adopt_architecture and adopt_family and kind == run_kind:
        logging.info("RESTORE_FROM: the model is the checkpoint's %r (the run file's %r gives way)",
                     restored.family, config.family)
        return
    if adopt_architecture and kind != run_kind:
        raise UserError(f"RESTORE_FROM holds a {restored.family!r} model ({kind}), which this run file's "
                        f"{run_kind} settings (its objective and feature lengths) cannot train; use a {kind} run "
                        "file, e.g. the quickstart of that family, with the same RESTORE_FROM.")
    if adopt_architecture:
        raise UserError(f"RESTORE_FROM holds a {restored.family!r} model but the command line chooses a "
                        f"{config.family!r} one (a --gin_file after the run file, or --gin.model_config.preset); "
                        f"leave the model choice out and the run takes the checkpoint's {restored.family!r} "
                        "architecture, or give RESTORE_FROM a checkpoint of the chosen family.")
    raise UserError(f"MODEL_DIR's checkpoint holds a {restored.family!r} model but the run's model_config builds a "
                    f"{config.family!r} one; use a run file of the checkpoint's family (model_config.preset of "
                    f"family {restored.family!r}), or another MODEL_DIR.")


def restored(config: models.FamilyConfig | None, *, resuming: bool, restore_from: str | None,
             adopt_family: bool = False) -> Restored | None:
    """The start of a run from a checkpoint's model `config` (None: a fresh run). Its model takes the checkpoint's
    architecture in a new run from RESTORE_FROM's parameters and in every resume of such a run (MODEL_DIR's
    checkpoint records the architecture the first run took), so an interrupted or extended RESTORE_FROM run resumes
    with the command that started it; of another family too with `adopt_family`."""
    if config is None:
        return None
    return Restored(config, adopt_architecture=not resuming or restore_from is not None, adopt_family=adopt_family,
                    resuming=resuming)


def pipeline_stack(config: models.FamilyConfig, stages: int, microbatches: int, repeats: int, rows: int,
                   batch_shards: int, shard_macros: str = "DATA_PARALLEL x FSDP_PARALLEL") -> Callable | None:
    """The pipelined layer stack for PIPELINE_PARALLEL > 1 (None without a pipeline); `rows` is a
    gradient-accumulation microbatch's row count, split `batch_shards` ways over the axes of `shard_macros`."""
    if stages == 1 and microbatches == 1 and repeats == 1:
        return None
    if stages == 1:
        raise UserError(f"NUM_MICROBATCHES={microbatches} / PIPELINE_REPEATS={repeats} need "
                        "PIPELINE_PARALLEL > 1; for microbatches without a pipeline use GRAD_ACCUM_STEPS.")
    schedule = pipeline.Schedule(stages, microbatches, repeats)
    stacks = config.pipeline_stacks()
    schedule.check(stacks, rows, batch_shards, shard_macros)
    logging.info("%s", schedule.describe(len(stacks)))
    return schedule.layer_stack
