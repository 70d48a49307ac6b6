"""train() (t5x_like.run.loop) in-process on a tiny GPT-2, and what a run leaves in its directory (the losses it
logged, its last checkpoint's parameters). tests/t5x_like/test_train.py and the tests that resume or compare
other runs with it (T5, scan layouts) share these. The train step's helpers are in tests/support/trainer.py."""
import json
import os

import jax

from models.gpt2 import GPT2Config
from partitioning import MeshShape
from t5x_like import optim
from t5x_like.checkpoint import store
from t5x_like.experiment import ExperimentSettings
from t5x_like.run import loop
from t5x_like.run.settings import LoopSettings, RunSettings

CONFIG = GPT2Config(vocab_size=256, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                    dropout_rate=0.1, attention_dropout_rate=0.1, dtype="float32")


TOTAL_STEPS = 20
"""The schedule's length (optim.make_optimizer.decay_steps) of every run here, whatever its number of steps: runs of
different lengths on one mesh then compile the same train step, which the suite's compilation cache shares."""


def optimizer(**settings) -> optim.OptimizerSettings:
    """AdamW at 3e-3, 2 warmup steps, cosine decay over TOTAL_STEPS (or `settings`)."""
    return optim.OptimizerSettings(**{"learning_rate": 3e-3, "warmup_steps": 2, "decay_steps": TOTAL_STEPS,
                                      **settings})


def experiment(mesh=None, **settings) -> ExperimentSettings:
    """The run's assembly: CONFIG on `mesh` (default data=2, fsdp=2, tensor=2), 8 rows of 16 tokens, optimizer()."""
    return ExperimentSettings(**{"model": CONFIG, "mesh": mesh or MeshShape(data=2, fsdp=2, tensor=2),
                                 "batch_size": 8, "optimizer": optimizer(), "feature_lengths": {"targets": 16},
                                 **settings})


def run_settings(model_dir, *, steps, mesh=None, settings=None, **loop_settings) -> RunSettings:
    """A run of `steps` steps in `model_dir` (checkpoints every 10 steps, no validation, every step logged, unless
    `loop_settings` say otherwise) of experiment(mesh, **settings)."""
    loop_settings = {"checkpoint_every": 10, "eval_every": 0, "log_every": 1, **loop_settings}
    return RunSettings(loop=LoopSettings(model_dir=str(model_dir), train_steps=steps, **loop_settings),
                       experiment=experiment(mesh, **(settings or {})))


def run(model_dir, source, *, steps, mesh=None, settings=None, **loop_settings) -> loop.TrainResult:
    """train() on `source`'s batches: see run_settings."""
    return loop.train(run_settings(model_dir, steps=steps, mesh=mesh, settings=settings, **loop_settings),
                      data_source=source)


def losses(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return {row["step"]: row["loss"] for row in map(json.loads, f) if "loss" in row}


def params_at(model_dir):
    _, step = store.locate(str(model_dir))
    return step, jax.device_get(store.restore_params(str(model_dir), None))
