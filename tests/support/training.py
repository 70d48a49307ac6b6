"""Training runs in-process, the one helper the tests that train share: the train step (t5x_like.step_fns) on a mesh
over given batches, train() (t5x_like.run.loop) in a MODEL_DIR and what the run leaves there, and the tiny T5's
span-corruption batches. The models are tests/support/families.py's tiny ones (one per family)."""
import dataclasses
import json
import logging
import os

import jax
import numpy as np

from models.t5 import T5Config
from partitioning import MeshShape
from t5x_like import optim
from t5x_like.checkpoint import store
from t5x_like.data import SourceSettings, make_source
from t5x_like.experiment import ExperimentSettings, build_experiment
from t5x_like.features import DECODER_INPUT_TOKENS
from t5x_like.run import loop
from t5x_like.run.settings import LoopSettings, RunSettings
from tests.support.families import TINY

TOTAL_STEPS = 20
"""The schedule's length for every run of 20 batches or fewer, whatever its number of steps: runs of different
lengths on one mesh compile the same train step, which the suite's compilation cache shares between tests."""

# ---------------------------------------------------------------- the train step over given batches

SEQ_LEN = 16
STEP_MODEL = dataclasses.replace(TINY["gpt2"], vocab_pad_multiple=1024)
"""The tiny GPT-2 with its vocabulary padded to 1024, so the logits dominate a step's memory (the evaluation in
microbatches shows its saving) and every mesh of 8 devices divides them."""


def batches(source_cls, count, batch_size=8):
    source = source_cls("train", batch_size=batch_size, feature_lengths={"targets": SEQ_LEN}, seed=3, shard_index=0,
                        shard_count=1)
    return [next(source) for _ in range(count)]


def step_experiment(mesh, rules, data, *, config=STEP_MODEL, feature_lengths=None, **settings):
    """build_experiment for `data` (AdamW at 3e-3, 2 warmup steps) on `mesh` with `rules`."""
    optimizer = optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=2)
    return build_experiment(ExperimentSettings(
        model=config, mesh=mesh, rules=rules, optimizer=optimizer, batch_size=len(data[0][DECODER_INPUT_TOKENS]),
        feature_lengths=feature_lengths or {"targets": SEQ_LEN}, **settings), train_steps=max(len(data), TOTAL_STEPS))


def run_steps(mesh, rules, data, *, config=STEP_MODEL, steps_between=None, **settings):
    """The train step over `data` batches; returns per-step metrics and the final state."""
    exp = step_experiment(mesh, rules, data, config=config, **settings)
    state = exp.init_state()
    history = []
    with exp.partitioner.activate():
        for i, batch in enumerate(data):
            if steps_between:
                steps_between(i)
            state, metrics = exp.train_step(state, exp.global_batch(batch))
            history.append({k: float(v) if np.ndim(v) == 0 else np.asarray(v)
                            for k, v in jax.device_get(metrics).items()})
    return history, state


class CompileLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        if "Compiling" in record.getMessage():
            self.messages.append(record.getMessage())


def compiled_after_first_step(train):
    """(the compilations jax logs after the first step of `train(steps_between=...)`, what it returns): `train` calls
    `steps_between(i)` before step i, as `run_steps` does."""
    handler = CompileLog()
    jax_logger = logging.getLogger("jax")

    def watch_after_first(i):
        if i == 1:
            jax.config.update("jax_log_compiles", True)
            jax_logger.addHandler(handler)

    try:
        result = train(steps_between=watch_after_first)
    finally:
        jax.config.update("jax_log_compiles", False)
        jax_logger.removeHandler(handler)
    return handler.messages, result


# ---------------------------------------------------------------- train() in a MODEL_DIR

LOOP_MODEL = dataclasses.replace(TINY["gpt2"], dropout_rate=0.1, attention_dropout_rate=0.1)
"""The tiny GPT-2 with dropout, so resumes show that the dropout stream continues too."""


def optimizer(**settings) -> optim.OptimizerSettings:
    """AdamW at 3e-3, 2 warmup steps, cosine decay over TOTAL_STEPS (or `settings`)."""
    return optim.OptimizerSettings(**{"learning_rate": 3e-3, "warmup_steps": 2, "decay_steps": TOTAL_STEPS,
                                      **settings})


def experiment_settings(mesh=None, **settings) -> ExperimentSettings:
    """The run's assembly: LOOP_MODEL on `mesh` (default data=2, fsdp=2, tensor=2), 8 rows of 16 tokens, optimizer()."""
    return ExperimentSettings(**{"model": LOOP_MODEL, "mesh": mesh or MeshShape(data=2, fsdp=2, tensor=2),
                                 "batch_size": 8, "optimizer": optimizer(), "feature_lengths": {"targets": SEQ_LEN},
                                 **settings})


def run_settings(model_dir, *, steps, mesh=None, settings=None, **loop_settings) -> RunSettings:
    """A run of `steps` steps in `model_dir` (checkpoints every 10 steps, no validation, every step logged, unless
    `loop_settings` say otherwise) of experiment_settings(mesh, **settings)."""
    loop_settings = {"checkpoint_every": 10, "eval_every": 0, "log_every": 1, **loop_settings}
    return RunSettings(loop=LoopSettings(model_dir=str(model_dir), train_steps=steps, **loop_settings),
                       experiment=experiment_settings(mesh, **(settings or {})))


def run_train(model_dir, source, *, steps, mesh=None, settings=None, **loop_settings) -> loop.TrainResult:
    """train() on `source`'s batches: see run_settings."""
    return loop.train(run_settings(model_dir, steps=steps, mesh=mesh, settings=settings, **loop_settings),
                      data_source=source)


def losses(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return {row["step"]: row["loss"] for row in map(json.loads, f) if "loss" in row}


def params_at(model_dir):
    _, step = store.locate(str(model_dir))
    return step, jax.device_get(store.restore_params(str(model_dir), None))


# ---------------------------------------------------------------- the tiny T5 on span corruption

T5_LENGTHS = {"inputs": 32, "targets": 8}
T5_MODEL = T5Config(vocab_size=8292, num_layers=2, num_decoder_layers=2, num_heads=4, embed_dim=32, d_kv=8, mlp_dim=64,
                    feed_forward="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0, dtype="float32")
"""The builtin corpus's 8192 ids + 100 sentinels; 4 heads and a vocabulary padded to 8320 divide every mesh."""


def span_corruption(split: str, *, packing: bool = False, **request):
    """The builtin corpus's span-corruption batches (make_source's `request`: batch size, lengths, seed, shard)."""
    return make_source(split, SourceSettings(objective="span_corruption", packing=packing), **request)
