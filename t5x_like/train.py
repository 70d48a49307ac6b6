"""`python -m t5x_like.train --gin_file=quickstart.gin --gin.MODEL_DIR="'/runs/quickstart'"`.

Parses absl flags and gin, then runs `train()`: assemble the run (experiment.build_experiment), open
the data, loop over steps, log, evaluate and checkpoint. The machinery lives in experiment / trainer /
checkpoints / metrics; this file only wires it together. `--print_config` prints every effective
setting (defaults included) and the model, then exits.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import inspect
import math
import os
import re
import sys
import time
from typing import Any, Callable

import gin
import jax
import numpy as np
from absl import flags, logging

import configs
import models
from partitioning import make_mesh
from t5x_like import (agreement, checkpoints, data, distributed, experiment, gin_cli, metrics, optim, run_lock,
                      stopping, storage, trainer, validate)
from t5x_like.data import loader
from t5x_like.errors import UserError, exit_on_user_error, run_absl_app
from t5x_like.experiment import Experiment, build_experiment
from t5x_like.lm import check_objective, make_lm

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")
INSTALLED_GIN_DIR = os.path.join(sys.prefix, "share", "t5x_like", "gin")

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file(s); bare names resolve in gin/.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; also written as --gin.NAME=VALUE.")
flags.DEFINE_multi_string("gin_search_paths", [], "Extra directories to resolve gin files and includes in.")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
flags.DEFINE_integer("heartbeat_timeout_seconds", distributed.HEARTBEAT_TIMEOUT_SECONDS,
                     "Multi-host: a process silent this long is declared dead and the others exit with an error.")
flags.DEFINE_integer("initialization_timeout_seconds", distributed.INITIALIZATION_TIMEOUT_SECONDS,
                     "Multi-host: how long processes wait for all of them to connect before exiting with an error.")
flags.DEFINE_bool("print_config", False, "Print every effective setting (defaults included) and the model "
                  "(shape, parameter count), checked as training would, then exit without touching MODEL_DIR.")

gin.external_configurable(make_mesh, module="partitioning")
gin.external_configurable(optim.make_optimizer, module="optim")
gin.external_configurable(trainer.LossScaleConfig, module="trainer")
make_source = gin.external_configurable(data.make_source, module="data")


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
    check_objective(config, gin.get_bindings("data.make_source").get("objective", "causal_lm"))
    return config


def run_vocab_size() -> int:
    """The vocabulary size of the tokenizer data.make_source's bindings select."""
    bound = gin.get_bindings("data.make_source")
    return data.tokenizer_vocab_size(data_path=bound.get("data_path"), tokenizer=bound.get("tokenizer"),
                                     tfds_name=bound.get("tfds_name"), objective=bound.get("objective", "causal_lm"))


@dataclasses.dataclass
class TrainResult:
    step: int
    stopped_by_signal: int | None = None


@gin.configurable(denylist=["data_source", "experiment"])
def train(*, model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED, checkpoint_every: int = 1000,
          keep_checkpoints: int = 3, eval_every: int = 0, eval_steps: int = 20, restore_from: str | None = None,
          log_every: int = 10, on_corrupt_checkpoint: str = "fallback", nonfinite_in_a_row: int = 5,
          restart_data: bool = False, data_source: Callable = make_source,
          experiment: Callable[..., Experiment] = build_experiment) -> TrainResult:
    """Train for `train_steps` steps, resuming from MODEL_DIR's newest intact checkpoint. `experiment`
    assembles the run (gin binds build_experiment's arguments); it is called with the restored model config.

    A step with a non-finite loss or gradients is never applied (build_experiment.on_nonfinite: 'stop'
    stops the run, nothing of that step saved; 'skip' goes on, and stops after `nonfinite_in_a_row` such steps
    in a row: the state itself is bad). A stop sets aside the checkpoints holding the state that gave the
    non-finite loss or gradients, so a restart resumes from an earlier one. `on_corrupt_checkpoint`: a damaged
    checkpoint is skipped for the previous one ('fallback', logged loudly) or stops the run ('stop').
    A resume continues the data where the checkpoint left it (at the next unseen row when BATCH_SIZE changed)
    and refuses data other than the checkpoint's; `restart_data` starts the data over instead."""
    check_settings(model_dir=model_dir, train_steps=train_steps, checkpoint_every=checkpoint_every,
                   keep_checkpoints=keep_checkpoints, eval_every=eval_every, eval_steps=eval_steps,
                   restore_from=restore_from, log_every=log_every, on_corrupt_checkpoint=on_corrupt_checkpoint,
                   nonfinite_in_a_row=nonfinite_in_a_row)
    primary = distributed.is_primary()
    with contextlib.ExitStack() as run:
        run.enter_context(storage.one_line_errors(model_dir))  # a full disk: one line, not orbax's tracebacks
        if primary:
            run.push(no_empty_folders_after_failure(model_dir))  # runs last, after the lock is released
            run.enter_context(run_lock.RunLock(model_dir))
        ckpt = checkpoints.Checkpointer(model_dir, keep=keep_checkpoints)
        run.callback(ckpt.close)
        latest = ckpt.latest_step()
        if latest is not None and latest >= train_steps and ckpt.intact(latest):
            agree_on_settings(latest)
            return finished_run(ckpt, latest, train_steps, model_dir)
        stored = ckpt.model_info() if latest is not None else (
            checkpoints.read_model_info(restore_from) if restore_from else None)
        exp = experiment(restored=models.config_from_dict(stored["config"]) if stored else None,
                         adopt_architecture=latest is None)
        source = open_source(data_source, "train", exp)
        run.callback(source.close)
        eval_source = open_source(data_source, "validation", exp) if eval_every else None
        if eval_source is not None:
            run.callback(eval_source.close)
            eval_batches = validation_batches(eval_source, eval_steps)
        agree_on_settings(latest)  # before the first collective: a process that failed or differs stops all
        # A resumed state is read straight into its shardings: nothing is initialised only to be replaced.
        target = exp.sharded_abstract_state()
        run.enter_context(exp.partitioner.activate())
        resumed = restore_newest(ckpt, target, exp.shardings, on_corrupt_checkpoint) if latest is not None else None
        if resumed is not None:
            state, data_state = resumed
            resume_data(source, data_state, restart_data)
            logging.info("resumed from %s at step %d", ckpt.directory, int(state.step))
            warn_schedule_change(stored, exp.optimizer, train_steps, int(state.step),
                                 int(optim.applied_updates(state.opt_state)))
        else:
            state = exp.init_state()
            if restore_from:
                state = state.replace(params=pretrained_params(restore_from, state.params, exp))
        step = int(state.step)
        if primary:
            write_config(model_dir, step)
        model_info = {"config": dataclasses.asdict(exp.config), "tokenizer": tokenizer_record(source),
                      "train_steps": train_steps}
        writer = metrics.MetricsWriter(model_dir, enabled=primary, start_step=step)
        run.callback(writer.close)
        throughput = metrics.Throughput(
            tokens_per_step=exp.tokens_per_step, flops_per_step=exp.flops_per_step,
            num_devices=jax.device_count(), peak=metrics.peak_tflops(jax.devices()[0].device_kind))
        stop = stopping.StopSignal()
        run.callback(stop.restore)
        check = NonfiniteCheck(state.params, exp.on_nonfinite, nonfinite_in_a_row)
        run.push(set_aside_bad_states(ckpt))
        run.callback(ckpt.wait)  # runs first: a started save completes even when a step fails
        start, first_step = time.perf_counter(), step
        step_fn = exp.train_step
        pending = None
        while step < train_steps and not stop.reached(step):
            batch = exp.global_batch(next(source))
            if step == first_step:
                step_fn = compile_step(step_fn, state, batch)
                throughput.reset()
            state, step_metrics = step_fn(state, batch)
            step += 1
            if pending:
                report(*pending, writer, throughput, train_steps, log_every, check)
            pending = (step, step_metrics)
            throughput.step_done()
            saving, evaluating = step % checkpoint_every == 0, eval_every and step % eval_every == 0
            if saving or evaluating:  # only a step that passed the check is saved or evaluated
                report(*pending, writer, throughput, train_steps, log_every, check)
                pending = None
            if saving:
                save(ckpt, step, state, source, model_info, exp.optimizer)
            if evaluating:
                evaluate(exp, state.params, eval_source, eval_batches, writer, step)
                throughput.reset()  # step times exclude evaluation (and its compilation)
        if pending:
            report(*pending, writer, throughput, train_steps, 1, check)
        if stop.signum:
            logging.warning("received signal %d at step %d: saving a checkpoint and stopping", stop.signum, step)
        if ckpt.latest_step() != step:
            save(ckpt, step, state, source, model_info, exp.optimizer)
        if eval_every and step % eval_every and step >= train_steps:
            evaluate(exp, state.params, eval_source, eval_batches, writer, step)
        ckpt.wait()
        if primary:
            logging.info("%s", summary(model_dir, step - first_step, step, train_steps, exp.tokens_per_step,
                                       time.perf_counter() - start))
    return TrainResult(step, stop.signum)


def agree_on_settings(latest: int | None) -> None:
    """Several processes: each one's settings, data files and checkpoint step must be process 0's."""
    if not agreement.active():
        return
    bound = gin.get_bindings(make_source)
    agreement.agree(agreement.run_facts(latest, [bound.get("data_path"), bound.get("tokenizer")]))


def no_empty_folders_after_failure(model_dir: str) -> Callable[..., None]:
    """An ExitStack callback: a start that fails (a configuration error found once MODEL_DIR is locked and
    orbax has made checkpoints/) removes the folders it made and left empty: new ones in MODEL_DIR, then
    MODEL_DIR and the parents made for it."""
    made, path = [], os.path.abspath(model_dir)
    while not os.path.exists(path):
        made.append(path)  # innermost first
        path = os.path.dirname(path)
    existing = set() if made else set(os.listdir(model_dir))

    def on_exit(exc_type, *_) -> None:
        if exc_type is None or not os.path.isdir(model_dir):
            return
        for name in sorted(set(os.listdir(model_dir)) - existing):
            if os.path.isdir(os.path.join(model_dir, name)) and not os.path.islink(os.path.join(model_dir, name)):
                for folder, _, _ in os.walk(os.path.join(model_dir, name), topdown=False):
                    with contextlib.suppress(OSError):  # it holds files: kept
                        os.rmdir(folder)
        for folder in made:
            try:
                os.rmdir(folder)
            except OSError:  # not empty: kept, and so are its parents
                return

    return on_exit


def check_settings(*, model_dir, train_steps, checkpoint_every, keep_checkpoints, eval_every, eval_steps,
                   restore_from, log_every, on_corrupt_checkpoint, nonfinite_in_a_row, **_) -> None:
    """train()'s settings in range and MODEL_DIR writable: run by train() and by --print_config."""
    validate.non_negative_int("TRAIN_STEPS", train_steps)
    validate.positive_int("CHECKPOINT_EVERY", checkpoint_every)
    validate.positive_int("train.keep_checkpoints", keep_checkpoints)
    validate.non_negative_int("EVAL_EVERY", eval_every, fix="0 = no periodic validation")
    if eval_steps != ALL_BATCHES:
        validate.positive_int("EVAL_STEPS", eval_steps, fix=f"or {ALL_BATCHES} for the whole validation split")
    validate.positive_int("train.log_every", log_every)
    validate.positive_int("train.nonfinite_in_a_row", nonfinite_in_a_row)
    validate.one_of("train.on_corrupt_checkpoint", on_corrupt_checkpoint, checkpoints.ON_CORRUPT)
    for name, value in (("MODEL_DIR", model_dir), ("RESTORE_FROM", "-" if restore_from is None else restore_from)):
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{name}={value!r}: expected a path in quotes, e.g. --gin.{name}=\"'/runs/run1'\".")
    validate.writable_dir("MODEL_DIR", model_dir)


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
        validate.finite_float("BLEND_WEIGHTS", weight, minimum=0.0, exclusive_minimum=True)


def bound_settings(configurable: Callable) -> dict:
    """The gin-bound arguments of a configurable merged over its defaults."""
    defaults = {name: p.default for name, p in inspect.signature(configurable).parameters.items()
                if p.default is not inspect.Parameter.empty}
    return {**defaults, **copy.deepcopy(gin.get_bindings(configurable, resolve_references=False))}


def pretrained_params(restore_from: str, params: Any, exp: Experiment) -> Any:
    """RESTORE_FROM's parameters for a new run; a head the checkpoint cannot supply (the family's
    HEAD_PARAMS: a classifier on a masked-LM encoder) keeps its fresh initialisation."""
    restored, fresh = checkpoints.restore_pretrained(
        restore_from, checkpoints.with_shardings(params, exp.shardings.params), exp.config.HEAD_PARAMS)
    logging.info("initialised parameters from %s (params only)%s", restore_from,
                 f"; {', '.join(fresh)} start fresh (not in the checkpoint)" if fresh else "")
    return {k: restored.get(k, v) for k, v in params.items()}


def finished_run(ckpt: checkpoints.Checkpointer, latest: int, train_steps: int, model_dir: str) -> TrainResult:
    """A restart of a run that has reached TRAIN_STEPS: say so, and apply keep_checkpoints."""
    ckpt.enforce_retention()
    logging.info("the run in %s is complete: its latest checkpoint is step %d and TRAIN_STEPS=%d; nothing to "
                 "do (raise TRAIN_STEPS to train further)", model_dir, latest, train_steps)
    return TrainResult(latest)


def write_config(model_dir: str, step: int) -> None:
    """MODEL_DIR/config.gin: the validated run's config (config.<step>.gin keeps each start's), and
    operative_config.gin: every setting, defaults included."""
    texts = {"config.gin": gin.config_str(), f"config.{step}.gin": gin.config_str(),
             "operative_config.gin": gin_cli.operative_config_str("train")}
    for name, text in texts.items():
        path = os.path.join(model_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


def compile_step(step_fn, state, batch):
    """The train step compiled ahead of the first step, saying so and how long it took."""
    logging.info("compiling the train step ...")
    started = time.perf_counter()
    compiled = step_fn.lower(state, batch).compile()
    logging.info("compiled the train step in %.1fs", time.perf_counter() - started)
    return compiled


def warn_schedule_change(stored: dict | None, optimizer: optim.Optimizer, train_steps: int, step: int,
                         applied: int) -> None:
    """Changing TRAIN_STEPS on resume reshapes the learning-rate schedule: show the jump (`applied`:
    the optimizer's count of applied updates, which the schedule reads)."""
    saved = (stored or {}).get("train_steps")
    if saved is None or saved == train_steps:
        return
    before, after = (stored or {}).get("next_learning_rate"), float(optimizer.schedule(applied))
    if isinstance(before, (int, float)) and math.isclose(before, after, rel_tol=1e-6):
        change = f"the learning rate stays at {after:.3e} at step {step}"
    else:
        jump = f"from {before:.3e} to {after:.3e}" if isinstance(before, (int, float)) else f"to {after:.3e}"
        change = f"at step {step} the learning rate jumps {jump}"
    logging.warning("TRAIN_STEPS=%d but the checkpoint's run had TRAIN_STEPS=%d: the learning-rate schedule "
                    "changes; %s", train_steps, saved, change)


def summary(model_dir: str, steps: int, step: int, train_steps: int, tokens_per_step: int, seconds: float) -> str:
    """The end-of-run lines: steps, tokens, wall time, validation losses, where the outputs are."""
    evals = [(row["step"], row["eval_loss"]) for row in metrics.read_rows(model_dir) if "eval_loss" in row]
    lines = [f"done: step {step}/{train_steps}; this run trained {steps} steps, {steps * tokens_per_step:,} tokens "
             f"in {datetime.timedelta(seconds=round(seconds))}"]
    if evals:
        best = min(evals, key=lambda e: e[1])
        lines.append(f"validation loss: final {evals[-1][1]:.4f} (step {evals[-1][0]}), best {best[1]:.4f} "
                     f"(step {best[0]})")
    lines.append(f"outputs in {model_dir}: checkpoints/, metrics.jsonl, tensorboard/, config.gin")
    return "\n".join(lines)


def restored_config(checkpoint: str) -> models.FamilyConfig:
    """The model config a checkpoint (MODEL_DIR or step directory) records."""
    return models.config_from_dict(checkpoints.read_model_info(checkpoint)["config"])


def open_source(data_source: Callable, split: str, exp: Experiment):
    """This host's batches of `split` (the part of every global batch the mesh gives its devices),
    checked against the model's vocabulary."""
    index, count = exp.host_layout
    source = data_source(split, batch_size=exp.host_batch_size, feature_lengths=exp.lengths, seed=exp.seed,
                         shard_index=index, shard_count=count)
    if source.vocab_size > exp.config.vocab_size:
        raise UserError(
            f"the tokenizer ({source.tokenizer_path}) has {source.vocab_size} ids but the model's vocab_size is "
            f"{exp.config.vocab_size}; give the model the tokenizer's vocabulary (--gin.model_config."
            f"vocab_from_tokenizer=True, or --gin.model_config.overrides=\"{{'vocab_size': {source.vocab_size}}}\") "
            "or use the model's own tokenizer.")
    return source


def resume_data(source, data_state: dict, restart_data: bool) -> None:
    """The data source at the checkpoint's position, or (`restart_data`) at its start, said so."""
    if not restart_data:
        source.set_state(data_state)
        return
    logging.warning("train.restart_data=True: the data starts over from its first batch (the model, optimizer and "
                    "step continue from the checkpoint)")


def tokenizer_record(source) -> dict | None:
    """What checkpoints record of the data's tokenizer: its files, so readers find it wherever the run moves
    (nothing, said once, when the data names a tokenizer that does not load: older token files)."""
    if not source.tokenizer_path:
        return None
    try:
        return data.tokenizer_record(data.load_tokenizer(source.tokenizer_path))
    except UserError as e:
        logging.warning("the checkpoints record no tokenizer: the data's tokenizer does not load (%s); generate, "
                        "eval and convert will need --tokenizer", e)
        return None


def train_state_item(state: trainer.TrainState) -> dict:
    """The checkpoint's train_state: all but the parameters (the FP8 state only when the model has one)."""
    item = {"step": state.step, "opt_state": state.opt_state, "rng": state.rng, "loss_scale": state.loss_scale}
    return item if state.fp8_state is None else {**item, "fp8_state": state.fp8_state}


def restore_state(ckpt, step, state, shardings):
    target = checkpoints.with_shardings(train_state_item(state), train_state_item(shardings))
    params, rest, data_state = ckpt.restore(step, params=checkpoints.with_shardings(state.params, shardings.params),
                                            train_state=target)
    return state.replace(params=params, **rest), data_state


def restore_newest(ckpt, state, shardings, on_corrupt: str):
    """(state, data position) from the newest checkpoint that verifies, or None when there is none."""
    target = checkpoints.with_shardings(train_state_item(state), train_state_item(shardings))
    restored = ckpt.restore_newest(params=checkpoints.with_shardings(state.params, shardings.params),
                                   train_state=target, on_corrupt=on_corrupt)
    if restored is None:
        return None
    _, params, rest, data_state = restored
    return state.replace(params=params, **rest), data_state


NONFINITE_SUFFIX = ".nonfinite"


class NonfiniteLossError(UserError, FloatingPointError):
    """A run stopped by a non-finite loss, gradients or update. `bad_from`: the first step whose state gave a
    non-finite loss or gradients (its checkpoints and later ones are not resumed from); None when the state
    was fine (only the update overflowed)."""

    def __init__(self, message: str, bad_from: int | None):
        super().__init__(message)
        self.bad_from = bad_from


class NonfiniteCheck:
    """What a step with a non-finite loss, gradients or update leads to (the step itself never applied
    it): a warning ('skip', or a float16 loss scale that backs off), or a NonfiniteLossError naming the step,
    what was not finite and likely causes: at once ('stop'), or after `in_a_row` steps in a row whose loss or
    gradients were not finite (the state itself is bad: skipping cannot get past it). Every process reads the
    same replicated metrics, so every process stops at the same step."""

    def __init__(self, params, on_nonfinite: str, in_a_row: int = 5):
        self.leaf_names = [jax.tree_util.keystr(path, simple=True, separator="/")
                           for path, _ in jax.tree_util.tree_leaves_with_path(params)]
        self.on_nonfinite, self.in_a_row = on_nonfinite, in_a_row
        self.bad_since: int | None = None  # the first step of the current run of non-finite losses / gradients

    def __call__(self, step: int, values: dict, grad_finite: np.ndarray) -> None:
        bad = [name for name, finite in zip(self.leaf_names, grad_finite) if not finite]
        state_bad = values["skipped"] and (bad or not math.isfinite(values["loss"]))
        self.bad_since = (self.bad_since or step) if state_bad else None
        if not values["skipped"]:
            return
        what = (f"loss is {values['loss']}" if not math.isfinite(values["loss"]) else
                f"loss is {values['loss']:.4f} but the gradients are not finite" if bad else
                f"loss is {values['loss']:.4f} and the gradients are finite, but the update overflowed (it would "
                "have made parameters or optimizer statistics non-finite)")
        where = (f"; non-finite gradients in {len(bad)} of {len(self.leaf_names)} parameters: "
                 f"{', '.join(bad[:8])}{', ...' if len(bad) > 8 else ''}") if bad else ""
        skipping = self.on_nonfinite == "skip" or "loss_scale" in values
        if skipping and not (state_bad and step - self.bad_since + 1 >= self.in_a_row):
            logging.warning("step %d: %s%s; update skipped%s", step, what, where,
                            f" at loss scale {values['loss_scale']:g}" if "loss_scale" in values else "")
            return
        if skipping:
            what = (f"{step - self.bad_since + 1} steps in a row (train.nonfinite_in_a_row) had a non-finite loss "
                    f"or gradients, from step {self.bad_since}: the model's state itself is bad, skipping cannot get "
                    f"past it; at step {step} the {what}")
        raise NonfiniteLossError(
            f"step {step}: {what}{where}. The update was not applied. Likely causes: a learning rate too high for "
            "this model or batch (lower LEARNING_RATE, lengthen WARMUP_STEPS, keep gradient clipping on); "
            "float16 overflow (use bfloat16 or float32); bad input (token ids beyond the vocabulary, NaN loss "
            "weights)." + ("" if skipping else " Or set build_experiment.on_nonfinite='skip' to skip such steps."),
            bad_from=(self.bad_since - 1) if self.bad_since else None)


def set_aside_bad_states(ckpt: checkpoints.Checkpointer) -> Callable[..., None]:
    """An ExitStack callback: a run stopped by NonfiniteLossError sets aside the checkpoints that hold the
    state which gave the non-finite loss or gradients (the step before it, and any later), so no restart
    resumes from them, and its message says where a restart resumes."""

    def on_exit(exc_type, error, _) -> None:
        if not isinstance(error, NonfiniteLossError):
            return
        moved = ckpt.set_aside_from(error.bad_from, NONFINITE_SUFFIX) if error.bad_from is not None else []
        latest = ckpt.latest_step()
        resumes = (f"a restart resumes from step {latest}" if latest is not None else
                   "there is no earlier checkpoint: a restart starts the run over")
        if moved:
            names = ", ".join(f"{s}{NONFINITE_SUFFIX}" for s in moved)
            resumes = (f"checkpoint step(s) {', '.join(map(str, moved))} held that state and were set aside in "
                       f"{ckpt.directory} as {names}; {resumes}")
        raise NonfiniteLossError(f"{error} Nothing of this or a later step was saved; {resumes}.",
                                 error.bad_from) from None

    return on_exit


def report(step, step_metrics, writer, throughput, total, log_every, check: NonfiniteCheck) -> None:
    """Check one step's metrics on the host; every `log_every` steps, write and print them."""
    host = jax.device_get(step_metrics)
    grad_finite = host.pop("grad_finite")
    values = {k: float(v) for k, v in host.items()}
    check(step, values, grad_finite)
    if step % log_every and step != total:
        return
    row = {k: v for k, v in values.items() if k != "tokens"}
    row.update(throughput.measure())
    writer.write(step, row)
    logging.info(metrics.console_line(step, total, row, row["step_time"]))


def save(ckpt: checkpoints.Checkpointer, step: int, state: trainer.TrainState, source, model_info: dict,
         optimizer: optim.Optimizer) -> None:
    info = {**model_info, "next_learning_rate": float(optimizer.schedule(optim.applied_updates(state.opt_state)))}
    ckpt.save(step, params=state.params, train_state=train_state_item(state), data_state=source.get_state(),
              model=info)


ALL_BATCHES = -1
"""EVAL_STEPS = -1: every batch of the validation split."""


def validation_batches(source, eval_steps: int) -> int:
    """How many batches each evaluation reads: EVAL_STEPS, or the whole split (-1, or when the split holds fewer;
    said here, once)."""
    available = source.num_batches
    if available is None:
        if eval_steps == ALL_BATCHES:
            raise UserError("EVAL_STEPS=-1 (the whole validation split) needs a split whose length is known ahead "
                            "(token files, pair and labelled files); a TFDS source streams its split: give "
                            "EVAL_STEPS a number of batches.")
        return eval_steps
    rows = f"{available} global batches of BATCH_SIZE rows, the last filled up with rows that count nothing"
    if eval_steps == ALL_BATCHES:
        logging.info("validation: the whole split every time: %s", rows)
    elif eval_steps > available:
        logging.warning("validation: EVAL_STEPS=%d, but the validation split holds only %s; every evaluation "
                        "reads the whole split once (EVAL_STEPS=-1 says so)", eval_steps, rows)
    else:
        return eval_steps
    return available


def evaluate(exp: Experiment, params, source, batches: int, writer, step) -> None:
    """Validation loss and token accuracy over the first `batches` batches of the validation split."""
    source.reset()
    sums = {"nll_sum": 0.0, "accuracy_sum": 0.0, "weight_sum": 0.0}
    for _ in range(batches):
        out = jax.device_get(exp.eval_step(params, exp.global_batch(next(source))))
        sums = {k: total + float(out[k]) for k, total in sums.items()}
    weight = max(sums["weight_sum"], 1.0)
    loss, accuracy = sums["nll_sum"] / weight, sums["accuracy_sum"] / weight
    writer.write(step, {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 80.0)), "eval_accuracy": accuracy})
    logging.info("step %d: validation loss %.4f, perplexity %.2f, token accuracy %.4f", step, loss,
                 math.exp(min(loss, 80.0)), accuracy)


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
    gin_cli.parse_files(files)
    for binding in bindings:
        name = binding.split("=", 1)[0].strip()
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", name):
            try:
                gin.query_parameter(f"%{name}")
            except ValueError:
                raise UserError(f"--gin.{name}: no gin file defines the macro {name}; check the spelling "
                                "(`--help` and gin/base.gin list the macros).") from None
    gin_cli.apply_bindings(bindings)
    extra = gin_cli.apply_extra_file()
    if extra:
        logging.info("%s=%s: applied after the command line", gin_cli.EXTRA_GIN_ENV, extra)
    try:
        gin.finalize()
    except ValueError as e:
        required = re.match(r"(\w+)/macro\.value set to `%gin\.REQUIRED`", str(e))
        if not required:
            raise
        raise UserError(f"{required[1]} is required: pass --gin.{required[1]}=... (strings need inner "
                        f"quotes, e.g. --gin.MODEL_DIR=\"'/runs/run1'\") or set it in a gin file.") from None
    check_seq_len_is_used()


def check_seq_len_is_used() -> None:
    """SEQ_LEN is the decoder-only shorthand for FEATURE_LENGTHS = {'targets': SEQ_LEN}: set while the run's
    FEATURE_LENGTHS does not use it (an encoder-decoder run file), it would be silently ignored."""
    values = gin_cli.macro_values()
    seq_len, lengths = values.get("SEQ_LEN"), values.get("FEATURE_LENGTHS")
    if seq_len is None or not isinstance(lengths, dict):
        return
    if not any(isinstance(v, gin.config.ConfigurableReference) for v in lengths.values()):
        raise UserError(f"SEQ_LEN={seq_len} is not used: the run sets FEATURE_LENGTHS={lengths} itself (SEQ_LEN is "
                        "the decoder-only shorthand for FEATURE_LENGTHS={'targets': N}); set FEATURE_LENGTHS, e.g. "
                        f"--gin.FEATURE_LENGTHS=\"{dict(lengths, targets=seq_len)}\", and leave SEQ_LEN unset.")


def describe_run() -> str:
    """Every effective setting (gin text, defaults included) and the model, checked by assembling the
    experiment as train() does (nothing is initialised or compiled); reads MODEL_DIR's checkpoint, if
    any, and writes nothing. A mesh this machine's devices cannot hold (a pod's configuration on a
    workstation) is reported, not checked."""
    bound = bound_settings(train)  # evaluates the macros
    check_settings(**bound)
    check_data_settings(bound_settings(make_source))
    model_dir, restore_from = bound["model_dir"], bound.get("restore_from")
    resuming = has_checkpoint(model_dir)
    restored_from = model_dir if resuming else restore_from
    restored = restored_config(restored_from) if restored_from else None
    mesh_sizes = gin.get_bindings("partitioning.make_mesh")
    try:
        mesh = make_mesh(**mesh_sizes)
    except UserError as e:
        mesh, mesh_note = None, str(e)
    if mesh is not None:
        exp = build_experiment(mesh=mesh, restored=restored, adopt_architecture=not resuming)
        config, num_params = exp.config, exp.num_params
        mesh_line = f"#   mesh {dict(mesh.shape)}, rules {exp.partitioner.rules.name!r}"
    else:
        model = copy.deepcopy(gin.get_bindings("build_experiment", resolve_references=False)["model"])
        config = experiment.resolve_model_config(model, max(mesh_sizes.get("tensor", 1), 1), restored,
                                                 adopt_architecture=not resuming)
        num_params = make_lm(config).num_params()
        mesh_line = (f"#   mesh not checked on this machine's {jax.device_count()} devices ({mesh_note}); "
                     "`python -m t5x_like.compile --topology=...` checks it for the target")
    lines = [f"# Model: {config.summary()}", f"#   {num_params:,} parameters", mesh_line]
    if restored_from:
        lines.append(f"#   {'resumes from' if resuming else 'parameters from'} {restored_from}")
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
        if record.exc_info and storage.aftermath(record.exc_info[1]):  # a failed save: train's StorageError says it
            return False
        return record.levelno >= std_logging.WARNING or "orbax" not in record.pathname

    logging.get_absl_handler().addFilter(keep)


@exit_on_user_error
@agreement.stop_together
@gin_cli.plain_user_errors
def main(argv: list[str]) -> None:
    del argv
    quiet_library_logs()
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                           initialization_timeout=FLAGS.initialization_timeout_seconds,
                           heartbeat_timeout_seconds=FLAGS.heartbeat_timeout_seconds)
    parse_gin(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
    if FLAGS.print_config:
        print(describe_run(), end="")
        return
    result = train()
    if result.stopped_by_signal:
        sys.exit(128 + result.stopped_by_signal)


def usage_with_macros(doc: str) -> str:
    """The module doc for --help, followed by base.gin's macros ('%' escaped for absl's usage())."""
    base = os.path.join(GIN_DIR if os.path.isdir(GIN_DIR) else INSTALLED_GIN_DIR, "base.gin")
    macros = gin_cli.macros_help(base).replace("%", "%%")
    return f"{doc}\nMacros (--gin.NAME=VALUE; strings need inner quotes: --gin.RULES=\"'fsdp'\"):\n{macros}\n"


if __name__ == "__main__":
    __doc__ = usage_with_macros(__doc__)  # noqa: A001 (absl prints the main module's doc for --help)
    run_absl_app(main, flags_parser=parse_flags)
