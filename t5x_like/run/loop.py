"""Training: `train()` assembles a run (experiment.build_experiment) on MODEL_DIR, opens its data, starts from
its newest checkpoint (t5x_like/run/resume.py), and runs the step loop: metrics checked (t5x_like/run/nonfinite.py),
logged and written one step behind, checkpoints and validation (t5x_like/run/validation.py) at their intervals,
a stop agreed by every process (t5x_like/run/stopping.py). The CLI is t5x_like/train.py."""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import os
import time
from typing import Callable

import jax
from absl import logging

import models
from t5x_like import metrics, step_fns
from t5x_like.checkpoint import store
from t5x_like.cluster import agreement, peers, processes
from t5x_like.data import check_model_vocabulary, load_tokenizer, make_source
from t5x_like.errors import UserError
from t5x_like.eval.harness import during_training
from t5x_like.experiment import Experiment, build_experiment, restored
from t5x_like.run import directory, nonfinite, resume, saving, stopping, validation
from t5x_like.run.settings import RunSettings, check_model_dir


@dataclasses.dataclass
class TrainResult:
    step: int
    stopped_by_signal: int | None = None


def train(settings: RunSettings, *, data_source: Callable | None = None) -> TrainResult:
    """Train the run `settings` describe for TRAIN_STEPS steps on MODEL_DIR, resuming from its newest intact
    checkpoint (run/settings.py's LoopSettings say what it saves, validates and does when something fails).
    `data_source`: what makes the batches of a split (default: data.make_source with the run's data settings;
    tests give synthetic ones).

    A step with a non-finite loss or gradients is never applied (build_experiment.on_nonfinite: 'stop' stops the
    run, nothing of that step saved; 'skip' goes on, and stops after `nonfinite_in_a_row` such steps in a row: the
    state itself is bad). A stop sets aside the checkpoints holding the state that gave the non-finite loss or
    gradients, so a restart resumes from an earlier one. A resume continues the data where the checkpoint left it
    (at the next unseen row when BATCH_SIZE changed). MODEL_DIR/config.gin and operative_config.gin record the
    settings' configuration texts."""
    loop = settings.loop
    loop.check()
    check_model_dir(loop.model_dir)
    data_source = data_source or functools.partial(make_source, settings=settings.source)
    with contextlib.ExitStack() as run:
        ckpt = directory.open_model_dir(run, loop.model_dir, loop.keep_checkpoints, loop.save_steps)
        latest = ckpt.latest_step()
        if latest is not None and latest >= loop.train_steps and ckpt.intact(latest):
            agree_on_settings(settings, latest)
            return finished_run(ckpt, latest, loop.train_steps, loop.model_dir)
        stored = resume.stored_model_info(ckpt, latest, loop.restore_from)
        exp = build_experiment(settings.experiment, train_steps=loop.train_steps, restored=restored(
            models.config_from_dict(stored["config"]) if stored else None, resuming=latest is not None,
            restore_from=loop.restore_from, adopt_family=not settings.model_chosen))
        source = open_source(run, data_source, "train", exp)
        validating = open_validation(run, data_source, exp, loop.eval_steps) if loop.eval_every else None
        agree_on_settings(settings, latest)  # before the first collective: a process that failed or differs stops all
        target = exp.sharded_abstract_state()  # a resumed state is read straight into its shardings
        run.enter_context(exp.partitioner.activate())
        state = resume.starting_state(ckpt, exp, target, source, resuming=latest is not None, stored=stored,
                                      restore_from=loop.restore_from, on_corrupt=loop.on_corrupt_checkpoint,
                                      restart_data=loop.restart_data, train_steps=loop.train_steps)
        return Loop(run, exp, ckpt, source, validating, state, settings).run(state)


def agree_on_settings(settings: RunSettings, latest: int | None) -> None:
    """Several processes: each one's settings, data files and checkpoint step must be process 0's."""
    if peers.active():
        agreement.agree(agreement.run_facts(latest, [settings.source.data_path, settings.source.tokenizer],
                                            settings.bindings))


class Loop:
    """One run's steps: each step's metrics checked and logged one step behind (the devices keep working),
    checkpoints and validation at their intervals, until TRAIN_STEPS or a signal every process agrees on."""

    def __init__(self, run: contextlib.ExitStack, exp: Experiment, ckpt: store.Checkpointer, source,
                 validating, state: step_fns.TrainState, settings: RunSettings):
        loop = settings.loop
        self.exp, self.ckpt, self.source, self.validating = exp, ckpt, source, validating
        self.model_dir, self.train_steps, self.log_every = loop.model_dir, loop.train_steps, loop.log_every
        self.eval_every = loop.eval_every
        self.primary = processes.is_primary()
        if self.primary:
            directory.write_config(loop.model_dir, int(state.step), settings.config_text, settings.operative_config)
        model_info = {"config": dataclasses.asdict(exp.config), "tokenizer": resume.tokenizer_record(source),
                      "train_steps": loop.train_steps}
        self.saves = saving.Saves(ckpt, source, model_info, exp.optimizer, checkpoint_every=loop.checkpoint_every,
                                  save_steps=loop.save_steps)
        self.writer = metrics.MetricsWriter(loop.model_dir, enabled=self.primary, start_step=int(state.step),
                                            tensorboard_dir=loop.tensorboard_dir)
        run.callback(self.writer.close)
        self.lm_eval = lm_eval_evaluator(settings.lm_eval, exp, source)
        self.throughput = metrics.Throughput(
            rows_per_step=exp.batch_size, tokens_per_step=exp.tokens_per_step, flops_per_step=exp.flops_per_step,
            num_devices=jax.device_count(), peak=metrics.peak_tflops(jax.devices()[0].device_kind))
        self.stop = stopping.StopSignal()
        run.callback(self.stop.restore)
        self.check = nonfinite.NonfiniteCheck(state.params, exp.on_nonfinite, loop.nonfinite_in_a_row,
                                              exp.step_config.loss_scale)
        run.push(nonfinite.set_aside_bad_states(ckpt))
        run.callback(ckpt.wait)  # runs first: a started save completes even when a step fails

    def run(self, state: step_fns.TrainState) -> TrainResult:
        step = first_step = int(state.step)
        start, step_fn, pending = time.perf_counter(), self.exp.train_step, None
        self.saves.initial(state)  # Pythia's step 0
        while step < self.train_steps and not self.stop.reached(step):
            batch = self.exp.global_batch(next(self.source))
            if step == first_step:
                step_fn = compile_step(step_fn, state, batch)
                self.throughput.reset()
            state, step_metrics = step_fn(state, batch)
            step += 1
            for began in self.source.passes_begun:  # once its step is trained, not when the loader reads ahead
                logging.info("%s", began.describe(step))
            pending = self.after_step(step, state, step_metrics, pending)
        self.finish(step, state, pending)
        if self.primary:
            tokens = self.exp.rows_trained(first_step, step) * sum(self.exp.lengths.values())
            logging.info("%s", summary(self.model_dir, step - first_step, step, self.train_steps, tokens,
                                       time.perf_counter() - start, self.writer.tensorboard))
        return TrainResult(step, self.stop.signum)

    def after_step(self, step: int, state: step_fns.TrainState, step_metrics, pending):
        """Report the previous step; save and evaluate this one at their intervals. Returns what is pending."""
        if pending:
            self.report(*pending)
        self.throughput.step_done(self.exp.rows_trained(step - 1, step))
        saving = self.saves.due(step)
        evaluating = self.eval_every and step % self.eval_every == 0
        lm_eval_due = self.lm_eval is not None and self.lm_eval.due(step)
        if not (saving or evaluating or lm_eval_due):
            return step, step_metrics
        self.report(step, step_metrics)  # only a step that passed the check is saved or evaluated
        if saving:
            self.saves.save(step, state)
        if evaluating:
            self.evaluate(step, state.params)
        if lm_eval_due:
            self.run_lm_eval(step, state.params)
        return None

    def finish(self, step: int, state: step_fns.TrainState, pending) -> None:
        """The last step's report, checkpoint and validation (a stop by signal included)."""
        if pending:
            self.report(*pending, log_every=1)
        if self.stop.signum:
            logging.warning("received signal %d at step %d: saving a checkpoint and stopping", self.stop.signum, step)
        self.saves.final(step, state)
        if self.eval_every and step % self.eval_every and step >= self.train_steps:
            self.evaluate(step, state.params)
        if self.lm_eval is not None and not self.lm_eval.due(step) and step >= self.train_steps:
            self.run_lm_eval(step, state.params)
        self.ckpt.wait()

    def report(self, step: int, step_metrics, log_every: int | None = None) -> None:
        """Check one step's metrics on the host; every `log_every` steps, write and print them."""
        host = jax.device_get(step_metrics)
        grad_finite = host.pop("grad_finite")
        values = {k: float(v) for k, v in host.items()}
        self.check(step, values, grad_finite)
        if step % (log_every or self.log_every) and step != self.train_steps:
            return
        row = {k: v for k, v in values.items() if k != "tokens"}
        row["batch_size"] = self.exp.rows_trained(step - 1, step)
        row.update(self.throughput.measure())
        self.writer.write(step, row)
        logging.info(metrics.console_line(step, self.train_steps, row, row["step_time"]))

    def evaluate(self, step: int, params) -> None:
        source, batches = self.validating
        validation.evaluate(self.exp, params, source, batches, self.writer, step)
        self.throughput.reset()  # step times exclude evaluation (and its compilation)

    def run_lm_eval(self, step: int, params) -> None:
        self.writer.write(step, self.lm_eval(params, step))
        self.throughput.reset()


def lm_eval_evaluator(settings: during_training.LmEvalDuringTraining, exp: Experiment,
                      source) -> during_training.TrainingEvaluator | None:
    """The lm-eval tasks of `settings` (lm_eval_during_training.*) on this run's model and tokenizer (loaded once,
    now); None when no tasks are set."""
    settings.check()
    if not settings.enabled:
        return None
    if source.tokenizer_path is None:
        raise UserError("lm_eval_during_training needs the run's tokenizer, and this data source records none: "
                        "train on token files (DATA_PATH) or the builtin corpus.")
    return during_training.TrainingEvaluator(settings, exp.config, exp.partitioner,
                                             load_tokenizer(source.tokenizer_path))


def open_validation(run: contextlib.ExitStack, data_source: Callable, exp: Experiment, eval_steps: int):
    """(the validation split's source, the batches each evaluation reads)."""
    source = open_source(run, data_source, "validation", exp)
    return source, validation.validation_batches(source, eval_steps)


def open_source(run: contextlib.ExitStack, data_source: Callable, split: str, exp: Experiment):
    """This host's batches of `split` (the part of every global batch the mesh gives its devices; training's ramp
    up with BATCH_SIZE_RAMPUP), built as the model reads them (its source_settings: an encoder-decoder's pair
    ends), checked against the model's vocabulary, closed with `run`."""
    index, count = exp.host_layout
    ramp = {"rampup": exp.rampup} if split == "train" and exp.rampup is not None else {}
    source = data_source(split, batch_size=exp.host_batch_size, feature_lengths=exp.lengths, seed=exp.seed,
                         shard_index=index, shard_count=count, **ramp, **exp.lm.source_settings())
    run.callback(source.close)
    check_model_vocabulary(exp.config.vocab_size, source.vocab_size, source.tokenizer_path)
    return source


def finished_run(ckpt: store.Checkpointer, latest: int, train_steps: int, model_dir: str) -> TrainResult:
    """A restart of a run that has reached TRAIN_STEPS: say so, and apply keep_checkpoints."""
    ckpt.enforce_retention()
    logging.info("the run in %s is complete: its latest checkpoint is step %d and TRAIN_STEPS=%d; nothing to "
                 "do (raise TRAIN_STEPS to train further)", model_dir, latest, train_steps)
    return TrainResult(latest)


def compile_step(step_fn, state, batch):
    """The train step compiled ahead of the first step, saying so and how long it took."""
    logging.info("compiling the train step ...")
    started = time.perf_counter()
    compiled = step_fn.lower(state, batch).compile()
    logging.info("compiled the train step in %.1fs", time.perf_counter() - started)
    return compiled


def summary(model_dir: str, steps: int, step: int, train_steps: int, tokens: int, seconds: float,
            tensorboard: str | None = None) -> str:
    """The end-of-run lines: steps, tokens, wall time, validation losses, where the outputs are."""
    evals = [(row["step"], row["eval_loss"]) for row in metrics.read_rows(model_dir) if "eval_loss" in row]
    lines = [f"done: step {step}/{train_steps}; this run trained {steps} steps, {tokens:,} tokens "
             f"in {datetime.timedelta(seconds=round(seconds))}"]
    if evals:
        best = min(evals, key=lambda e: e[1])
        lines.append(f"validation loss: final {evals[-1][1]:.4f} (step {evals[-1][0]}), best {best[1]:.4f} "
                     f"(step {best[0]})")
    own = tensorboard is None or os.path.abspath(tensorboard) == os.path.abspath(os.path.join(model_dir, "tensorboard"))
    lines.append(f"outputs in {model_dir}: checkpoints/, metrics.jsonl, {'tensorboard/, ' if own else ''}config.gin"
                 + ("" if own else f"; TensorBoard events in {tensorboard}"))
    return "\n".join(lines)
