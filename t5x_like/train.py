"""`python -m t5x_like.train --gin_file=gpt2.gin --gin.MODEL_DIR="'/runs/gpt2'"`.

Parses absl flags and gin, then runs `train()`: build mesh, model, state and data, loop over
steps, log, evaluate and checkpoint. `--print_config` prints every effective setting (defaults
included) and the model, then exits. The machinery lives in trainer / checkpoints / metrics /
partitioning; this file only wires it together.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
import re
import signal
import sys
from typing import Callable

import flax.linen as nn
import gin
import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags, logging

import configs
import models
from partitioning import Partitioner, make_mesh, pipeline
from t5x_like import checkpoints, data, distributed, gin_cli, inference, metrics, optim, trainer
from t5x_like.errors import UserError, exit_on_user_error

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")
INSTALLED_GIN_DIR = os.path.join(sys.prefix, "share", "t5x_like", "gin")

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file(s); bare names resolve in gin/.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; also written as --gin.NAME=VALUE.")
flags.DEFINE_multi_string("gin_search_paths", [], "Extra directories to resolve gin files and includes in.")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
flags.DEFINE_bool("print_config", False, "Print every effective setting (defaults included) and the model "
                  "(shape, parameter count), checked as training would, then exit without touching MODEL_DIR.")

gin.external_configurable(make_mesh, module="partitioning")
gin.external_configurable(optim.make_optimizer, module="optim")
gin.external_configurable(trainer.LossScaleConfig, module="trainer")
make_source = gin.external_configurable(data.make_source, module="data")


@gin.configurable
def model_config(preset: str = gin.REQUIRED, *, vocab_from_tokenizer: bool = False, dtype: str = "bfloat16",
                 attention: str = "auto", remat_policy: str = "none", scan_layers: bool = True,
                 overrides: dict | None = None):
    """A model config: the named preset (configs/), then the run's choices and overrides.

    `vocab_from_tokenizer`: the vocabulary is the run's tokenizer's (data.make_source's TOKENIZER, or the
    one its DATA_PATH files were made with, or the builtin corpus's), so any corpus trains the model.
    `overrides` set config fields; on the command line they merge key by key into the files' overrides.
    """
    values = dict(configs.get_model_config(preset).to_dict())
    if vocab_from_tokenizer:
        values["vocab_size"] = run_vocab_size()
    values.update(dtype=dtype, attention=attention, remat_policy=remat_policy, scan_layers=scan_layers)
    values.update(overrides or {})
    try:
        return models.config_from_dict(values)
    except ValueError as e:
        raise UserError(f"model_config (preset {preset!r}, overrides {overrides}): {e}") from None


def run_vocab_size() -> int:
    """The vocabulary size of the tokenizer data.make_source's bindings select."""
    bound = gin.get_bindings("data.make_source")
    return data.tokenizer_vocab_size(data_path=bound.get("data_path"), tokenizer=bound.get("tokenizer"),
                                     tfds_name=bound.get("tfds_name"))


@dataclasses.dataclass
class TrainResult:
    step: int
    stopped_by_signal: int | None = None


@gin.configurable(denylist=["data_source"])
def train(*, model_dir: str = gin.REQUIRED, model=gin.REQUIRED, mesh=gin.REQUIRED, rules: str = "fsdp_tensor",
          optimizer: optim.Optimizer = gin.REQUIRED, train_steps: int = gin.REQUIRED,
          batch_size: int = gin.REQUIRED, seq_len: int = gin.REQUIRED, seed: int = 0,
          grad_accum_steps: int = 1, z_loss: float = 0.0,
          loss_scale: trainer.LossScaleConfig = trainer.LossScaleConfig(),
          on_nonfinite: str = "stop", checkpoint_every: int = 1000, keep_checkpoints: int = 3,
          eval_every: int = 0, eval_steps: int = 20, restore_from: str | None = None,
          log_every: int = 10, pipeline_microbatches: int = 1, cross_entropy: str = "chunked",
          offload_optimizer_state: bool = False, pipeline_repeats: int = 1,
          data_source: Callable = make_source) -> TrainResult:
    """Train `model` for `train_steps` steps, resuming from MODEL_DIR's latest checkpoint."""
    if on_nonfinite not in ("stop", "skip"):
        raise UserError(f"train.on_nonfinite={on_nonfinite!r}: choose 'stop' or 'skip'.")
    partitioner = Partitioner(mesh, rules)
    check_batch(batch_size, grad_accum_steps, partitioner.batch_shards)
    primary = distributed.is_primary()
    if primary:
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "config.gin"), "w") as f:
            f.write(gin.config_str())
    ckpt = checkpoints.Checkpointer(model_dir, keep=keep_checkpoints)
    resume_step = ckpt.latest_step()
    stored = checkpoints.read_model_info(model_dir if resume_step is not None else restore_from) \
        if (resume_step is not None or restore_from) else None
    config = resolve_model_config(model, mesh.shape["tensor"], stored, adopt_architecture=resume_step is None)
    source = open_source(data_source, "train", batch_size, seq_len, seed, config)
    eval_source = open_source(data_source, "validation", batch_size, seq_len, seed, config) if eval_every else None

    step_config = trainer.StepConfig(
        grad_accum_steps=grad_accum_steps, z_loss=z_loss,
        loss_scale=loss_scale if config.dtype == "float16" else None,
        skip_nonfinite=on_nonfinite == "skip", cross_entropy=cross_entropy,
        offload_optimizer_state=offload_optimizer_state)
    module = pipelined(models.build_model(config), config, mesh.shape["stage"], pipeline_microbatches,
                       pipeline_repeats, batch_size // grad_accum_steps, partitioner.batch_shards)
    with partitioner.activate():
        state, shardings, num_params = create_state(
            module, optimizer, partitioner, seed, seq_len, step_config, config)
        if resume_step is not None:
            state, data_state = restore_state(ckpt, resume_step, state, shardings)
            source.set_state(data_state)
            logging.info("resumed from %s at step %d", ckpt.directory, resume_step)
        elif restore_from:
            state = state.replace(params=checkpoints.restore_params(
                restore_from, checkpoints.with_shardings(state.params, shardings.params)))
            logging.info("initialised parameters from %s (params only)", restore_from)
        batch_sharding = partitioner.batch_sharding()
        step_fn = jit_train_step(module, optimizer, step_config, shardings, partitioner)
        eval_fn = jax.jit(trainer.make_eval_step(module, cross_entropy), in_shardings=(shardings.params, batch_sharding),
                          out_shardings=partitioner.replicated)
        model_info = {"config": dataclasses.asdict(config), "tokenizer": source.tokenizer_path}
        writer = metrics.MetricsWriter(model_dir, enabled=primary)
        throughput = metrics.Throughput(
            tokens_per_step=batch_size * seq_len,
            flops_per_step=metrics.flops_per_token(num_params, config.num_layers, config.embed_dim, seq_len)
            * batch_size * seq_len,
            num_devices=jax.device_count(), peak=metrics.peak_tflops(jax.devices()[0].device_kind))
        stop = StopSignal()
        step = int(state.step)
        pending = None
        try:
            while step < train_steps and not stop.signum:
                batch = global_batch(next(source), batch_sharding)
                state, step_metrics = step_fn(state, batch)
                step += 1
                if pending:
                    report(*pending, writer, throughput, train_steps, log_every, on_nonfinite)
                pending = (step, step_metrics)
                throughput.step_done()
                if step % checkpoint_every == 0:
                    save(ckpt, step, state, source, model_info)
                if eval_every and step % eval_every == 0:
                    evaluate(eval_fn, state.params, eval_source, eval_steps, batch_sharding, writer, step)
            if pending:
                report(*pending, writer, throughput, train_steps, 1, on_nonfinite)
            if stop.signum:
                logging.warning("received signal %d at step %d: saving a checkpoint and stopping", stop.signum, step)
            if ckpt.latest_step() != step:
                save(ckpt, step, state, source, model_info)
            if eval_every and step % eval_every and step >= train_steps:
                evaluate(eval_fn, state.params, eval_source, eval_steps, batch_sharding, writer, step)
        finally:
            ckpt.wait()
            ckpt.close()
            writer.close()
            stop.restore()
    return TrainResult(step, stop.signum)


def check_batch(batch_size: int, grad_accum_steps: int, batch_shards: int) -> None:
    if batch_size % grad_accum_steps:
        raise UserError(f"BATCH_SIZE={batch_size} is not divisible by GRAD_ACCUM_STEPS={grad_accum_steps}.")
    micro = batch_size // grad_accum_steps
    if micro % batch_shards:
        raise UserError(
            f"each microbatch has {micro} rows (BATCH_SIZE={batch_size} / GRAD_ACCUM_STEPS={grad_accum_steps}), "
            f"which does not divide over the {batch_shards} data-parallel shards (DATA_PARALLEL x FSDP_PARALLEL). "
            f"Make BATCH_SIZE / GRAD_ACCUM_STEPS a multiple of {batch_shards}.")
    if batch_size % jax.process_count():
        raise UserError(f"BATCH_SIZE={batch_size} is not divisible by the {jax.process_count()} processes.")


def resolve_model_config(config, tensor: int, stored: dict | None, *, adopt_architecture: bool = False):
    """Pad the vocabulary to 128 x tensor, unless a checkpoint fixes the padded size already.

    With a checkpoint's model info (`stored`), the architectures must agree; `adopt_architecture`
    (RESTORE_FROM: a new run from a checkpoint's parameters) takes the checkpoint's instead, keeping
    the run's own choices (dtype, dropout, attention, remat, scan)."""
    config = dataclasses.replace(config, vocab_pad_multiple=128 * tensor)
    if stored is None:
        return config
    saved = models.config_from_dict(stored["config"])
    differ = {f: (v, config.architecture().get(f)) for f, v in saved.architecture().items()
              if config.architecture().get(f) != v}
    if differ and adopt_architecture:
        logging.info("RESTORE_FROM: the model takes the checkpoint's architecture (%s)",
                     ", ".join(f"{f} {new} instead of {old}" for f, (new, old) in differ.items()))
        config = dataclasses.replace(saved, **{f: getattr(config, f) for f in saved.RUN_FIELDS if hasattr(config, f)})
    elif differ:
        line = "{" + ", ".join(f"'{f}': {new!r}" for f, (new, _) in differ.items()) + "}"
        raise UserError(f"MODEL_DIR's checkpoint holds a different model (checkpoint vs config: {differ}); to "
                        f"continue it add --gin.model_config.overrides=\"{line}\", or use a new MODEL_DIR.")
    if saved.padded_vocab_size % tensor == 0:
        config = dataclasses.replace(config, vocab_pad_multiple=saved.vocab_pad_multiple)
    return config


def open_source(data_source: Callable, split: str, batch_size: int, seq_len: int, seed: int, config):
    source = data_source(split, batch_size=batch_size // jax.process_count(), seq_len=seq_len, seed=seed,
                         shard_index=jax.process_index(), shard_count=jax.process_count())
    if source.vocab_size > config.vocab_size:
        raise UserError(
            f"the tokenizer ({source.tokenizer_path}) has {source.vocab_size} ids but the model's vocab_size is "
            f"{config.vocab_size}; give the model the tokenizer's vocabulary (--gin.model_config.vocab_from_tokenizer"
            f"=True, or --gin.model_config.overrides=\"{{'vocab_size': {source.vocab_size}}}\") or use the model's "
            "own tokenizer.")
    if seq_len > config.max_len:
        raise UserError(f"SEQ_LEN={seq_len} exceeds the model's max_len {config.max_len}.")
    return source


def pipelined(module, config, stages: int, microbatches: int, repeats: int, rows: int, batch_shards: int):
    """`module` with its layer stack pipelined over the 'stage' mesh axis (PIPELINE_PARALLEL > 1);
    `rows` is a gradient-accumulation microbatch's row count."""
    if stages == 1 and microbatches == 1 and repeats == 1:
        return module
    if stages == 1:
        raise UserError(f"NUM_MICROBATCHES={microbatches} / train.pipeline_repeats={repeats} need "
                        "PIPELINE_PARALLEL > 1; for microbatches without a pipeline use GRAD_ACCUM_STEPS.")
    schedule = pipeline.Schedule(stages, microbatches, repeats)
    schedule.check(config.num_layers, rows, batch_shards)
    logging.info("%s", schedule.describe())
    return module.clone(layer_stack=schedule.layer_stack)


def abstract_state(module, optimizer, partitioner, seed, seq_len, step_config):
    """(init function, its abstract state, the state's shardings), checked to divide over the mesh."""
    init = lambda rng: trainer.init_train_state(  # noqa: E731
        module, optimizer.tx, rng, jnp.zeros((1, seq_len), jnp.int32), step_config.loss_scale)
    abstract = jax.eval_shape(lambda: init(jax.random.PRNGKey(seed)))  # no eager op: the mesh may be compile-only
    specs = nn.get_partition_spec(abstract)
    partitioner.check_divisible(abstract.params, specs.params)
    partitioner.check_divisible(abstract.opt_state, specs.opt_state, "opt_state")
    if distributed.is_primary():
        logging.info("parameter layout:\n%s", partitioner.describe(abstract.params, specs.params))
    opt_shardings = partitioner.shardings(specs.opt_state, "opt_state")
    if step_config.offload_optimizer_state:
        opt_shardings = jax.tree.map(lambda s: s.with_memory_kind("pinned_host"), opt_shardings)
    shardings = partitioner.shardings(specs).replace(opt_state=opt_shardings)
    return init, abstract, shardings


def jit_train_step(module, optimizer, step_config, shardings, partitioner):
    """The train step, jitted with the state's and the batch's shardings, donating the old state."""
    return jax.jit(trainer.make_train_step(module, optimizer.tx, optimizer.schedule, step_config),
                   in_shardings=(shardings, partitioner.batch_sharding()),
                   out_shardings=(shardings, partitioner.replicated), donate_argnums=0)


def create_state(module, optimizer, partitioner, seed, seq_len, step_config, config):
    """A sharded fresh state (initialised in place, no host holds the whole model) and its shardings."""
    init, _, shardings = abstract_state(module, optimizer, partitioner, seed, seq_len, step_config)
    state = jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(jax.random.PRNGKey(seed))
    num_params = count_params(state.params, config)
    logging.info("model: %s; %s parameters", config.summary(), f"{num_params:,}")
    return state, shardings, num_params


def count_params(params, config) -> int:
    """Parameters excluding the padding rows of the vocabulary (comparable with HF's counts)."""
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(params))
    return total - (config.padded_vocab_size - config.vocab_size) * config.embed_dim


def train_state_item(state: trainer.TrainState) -> dict:
    return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng, "loss_scale": state.loss_scale}


def restore_state(ckpt, step, state, shardings):
    target = checkpoints.with_shardings(train_state_item(state), train_state_item(shardings))
    params, rest, data_state = ckpt.restore(step, params=checkpoints.with_shardings(state.params, shardings.params),
                                            train_state=target)
    return state.replace(params=params, **rest), data_state


def global_batch(local: dict[str, np.ndarray], sharding) -> dict[str, jax.Array]:
    """This host's rows -> global arrays laid out over the data-parallel devices."""
    return {k: jax.make_array_from_process_local_data(sharding, np.asarray(v)) for k, v in local.items()}


def report(step, step_metrics, writer, throughput, total, log_every, on_nonfinite) -> None:
    """Check one step's metrics on the host; every `log_every` steps, write and print them."""
    values = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
    if not math.isfinite(values["loss"]):
        if on_nonfinite == "stop":
            raise FloatingPointError(
                f"step {step}: loss is {values['loss']}; stopping. Lower LEARNING_RATE, use bfloat16/float32, "
                "or set train.on_nonfinite='skip' to skip such steps.")
    if values["skipped"]:
        logging.warning("step %d: non-finite gradients, update skipped%s", step,
                        f" at loss scale {values['loss_scale']:g}" if "loss_scale" in values else "")
    if step % log_every and step != total:
        return
    row = {k: v for k, v in values.items() if k != "tokens"}
    row.update(throughput.measure())
    writer.write(step, row)
    logging.info(metrics.console_line(step, total, row, row["step_time"]))


def save(ckpt: checkpoints.Checkpointer, step: int, state: trainer.TrainState, source, model_info: dict) -> None:
    ckpt.save(step, params=state.params, train_state=train_state_item(state), data_state=source.get_state(),
              model=model_info)


def evaluate(eval_fn, params, source, eval_steps, sharding, writer, step) -> None:
    """Validation loss over the first `eval_steps` batches of the validation split."""
    source.reset()
    nll = weight = 0.0
    for _ in range(eval_steps):
        out = jax.device_get(eval_fn(params, global_batch(next(source), sharding)))
        nll, weight = nll + float(out["nll_sum"]), weight + float(out["weight_sum"])
    loss = nll / max(weight, 1.0)
    writer.write(step, {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 80.0))})
    logging.info("step %d: validation loss %.4f, perplexity %.2f", step, loss, math.exp(min(loss, 80.0)))


class StopSignal:
    """Records SIGTERM / SIGINT so the loop can checkpoint and stop between steps."""

    def __init__(self):
        self.signum: int | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, _frame):
        self.signum = signum

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, with --gin.NAME=VALUE rewritten to --gin_bindings=NAME=VALUE."""
    rewritten = [re.sub(r"^--gin\.([^=]+)=(.*)$", r"--gin_bindings=\1=\2", a, flags=re.S) for a in argv]
    return FLAGS(rewritten)


def parse_gin(files: list[str], bindings: list[str], search_paths: list[str]) -> None:
    """Load gin files (bare names resolve in gin/), then apply bindings (model_config.overrides merge
    into the files' dict), rejecting unknown macros and unquoted strings."""
    for path in [*search_paths, os.getcwd(), GIN_DIR, INSTALLED_GIN_DIR]:
        gin.add_config_file_search_path(path)
    if not files:
        raise UserError("no --gin_file given; e.g. --gin_file=quickstart.gin (files live in gin/).")
    gin.parse_config_files_and_bindings(files, None, finalize_config=False)
    for binding in bindings:
        name = binding.split("=", 1)[0].strip()
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            try:
                gin.query_parameter(f"%{name}")
            except ValueError:
                raise UserError(f"--gin.{name}: no gin file defines the macro {name}; check the spelling "
                                "(`--help` and gin/base.gin list the macros).") from None
    gin_cli.apply_bindings(bindings)
    try:
        gin.finalize()
    except ValueError as e:
        required = re.match(r"(\w+)/macro\.value set to `%gin\.REQUIRED`", str(e))
        if not required:
            raise
        raise UserError(f"{required[1]} is required: pass --gin.{required[1]}=... (strings need inner "
                        f"quotes, e.g. --gin.MODEL_DIR=\"'/runs/gpt2'\") or set it in a gin file.") from None


def train_arguments(devices=None) -> dict:
    """train()'s arguments as the parsed gin configuration sets them (defaults filled in, references
    evaluated), with the mesh built over `devices` (default: this machine's)."""
    return {**configured_arguments(), "mesh": make_mesh(**gin.get_bindings("partitioning.make_mesh"), devices=devices)}


def configured_arguments() -> dict:
    """train()'s arguments but the mesh, as the parsed gin configuration sets them."""
    defaults = {name: p.default for name, p in inspect.signature(train).parameters.items() if name != "mesh"}
    bound = gin.get_bindings("train", resolve_references=False)
    bound.pop("mesh", None)
    return {**defaults, **copy.deepcopy(bound)}  # deepcopy evaluates gin references and macros


def describe_run() -> str:
    """Every effective setting (gin text, defaults included) and the model it builds, checked as train()
    checks them before its first step; reads MODEL_DIR's checkpoint, if any, and writes nothing. A mesh
    this machine's devices cannot hold (a pod's configuration on a workstation) is reported, not checked."""
    a = configured_arguments()
    mesh_sizes = gin.get_bindings("partitioning.make_mesh")
    try:
        mesh = make_mesh(**mesh_sizes)
    except UserError as e:
        mesh, mesh_note = None, str(e)
    resuming = has_checkpoint(a["model_dir"])
    stored_at = a["model_dir"] if resuming else a["restore_from"]
    stored = checkpoints.read_model_info(stored_at) if stored_at else None
    tensor = mesh.shape["tensor"] if mesh else max(mesh_sizes.get("tensor", 1), 1)
    config = resolve_model_config(a["model"], tensor, stored, adopt_architecture=not resuming)
    if a["seq_len"] > config.max_len:
        raise UserError(f"SEQ_LEN={a['seq_len']} exceeds the model's max_len {config.max_len}.")
    params, specs = inference.abstract_params(config)
    lines = [f"# Model: {config.summary()}", f"#   {count_params(params, config):,} parameters"]
    if mesh:
        partitioner = Partitioner(mesh, a["rules"])
        check_batch(a["batch_size"], a["grad_accum_steps"], partitioner.batch_shards)
        pipelined(models.build_model(config), config, mesh.shape["stage"], a["pipeline_microbatches"],
                  a["pipeline_repeats"], a["batch_size"] // a["grad_accum_steps"], partitioner.batch_shards)
        partitioner.check_divisible(params, specs)
        lines.append(f"#   mesh {dict(mesh.shape)}, rules {a['rules']!r}")
    else:
        lines.append(f"#   mesh not checked on this machine's {jax.device_count()} devices ({mesh_note}); "
                     "`python -m t5x_like.compile --topology=...` checks it for the target")
    if stored_at:
        lines.append(f"#   {'resumes from' if resuming else 'parameters from'} {stored_at}")
    lines.append("#   resolved model config (preset, model_config choices and overrides merged):")
    lines += [f"#     {k} = {v!r}" for k, v in dataclasses.asdict(config).items()]
    return gin_cli.operative_config_str("train") + "\n" + "\n".join(lines) + "\n"


def has_checkpoint(model_dir: str) -> bool:
    try:
        checkpoints.locate(model_dir)
    except FileNotFoundError:
        return False
    return True


def quiet_library_logs() -> None:
    """Keep orbax's per-save INFO chatter and gin's file-probing messages ('Path not found' for
    each search path it tries) out of the console; orbax warnings still show."""
    import logging as std_logging

    def keep(record: std_logging.LogRecord) -> bool:
        if "gin" in record.pathname and record.pathname.endswith("resource_reader.py"):
            return False
        return record.levelno >= std_logging.WARNING or "orbax" not in record.pathname

    logging.get_absl_handler().addFilter(keep)


@exit_on_user_error
@gin_cli.plain_user_errors
def main(argv: list[str]) -> None:
    del argv
    quiet_library_logs()
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
    parse_gin(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
    if FLAGS.print_config:
        print(describe_run(), end="")
        return
    write_operative_config()
    result = train()
    if result.stopped_by_signal:
        sys.exit(128 + result.stopped_by_signal)


def write_operative_config() -> None:
    """MODEL_DIR/operative_config.gin: every setting of the run, defaults included (config.gin holds
    the files and bindings as given)."""
    if not distributed.is_primary():
        return
    model_dir = copy.deepcopy(gin.get_bindings("train", resolve_references=False)["model_dir"])
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, "operative_config.gin"), "w") as f:
        f.write(gin_cli.operative_config_str("train"))


def usage_with_macros(doc: str) -> str:
    """The module doc for --help, followed by base.gin's macros ('%' escaped for absl's usage())."""
    base = os.path.join(GIN_DIR if os.path.isdir(GIN_DIR) else INSTALLED_GIN_DIR, "base.gin")
    macros = gin_cli.macros_help(base).replace("%", "%%")
    return f"{doc}\nMacros (--gin.NAME=VALUE; strings need inner quotes: --gin.RULES=\"'fsdp'\"):\n{macros}\n"


if __name__ == "__main__":
    __doc__ = usage_with_macros(__doc__)  # noqa: A001 (absl prints the main module's doc for --help)
    app.run(main, flags_parser=parse_flags)
