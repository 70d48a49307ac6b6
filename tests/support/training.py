"""train() (t5x_like.run.loop) in-process on a tiny GPT-2, and what a run leaves in its directory (the losses it
logged, its last checkpoint's parameters). tests/t5x_like/test_train.py and the tests that resume or compare
other runs with it (T5, scan layouts) share these. The train step's helpers are in tests/support/trainer.py."""
import functools
import json
import os

import jax

from models.gpt2 import GPT2Config
from partitioning import make_mesh
from t5x_like import optim
from t5x_like.checkpoint import store
from t5x_like.experiment import build_experiment
from t5x_like.run import loop

CONFIG = GPT2Config(vocab_size=256, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                    dropout_rate=0.1, attention_dropout_rate=0.1, dtype="float32")


def experiment(mesh=None, total_steps=20, **settings):
    """The run's assembly (build_experiment's arguments); train() calls it with the restored config."""
    settings = dict(dict(model=CONFIG, mesh=mesh or make_mesh(data=2, fsdp=2, tensor=2), batch_size=8,
                         optimizer=optim.make_optimizer(learning_rate=3e-3, warmup_steps=2, total_steps=total_steps),
                         feature_lengths={"targets": 16}), **settings)
    return functools.partial(build_experiment, **settings)


def run(model_dir, source, *, steps, mesh=None, total_steps=20, settings=None, **kwargs):
    kwargs = dict(dict(checkpoint_every=10, eval_every=0, log_every=1), **kwargs)
    return loop.train(model_dir=str(model_dir), train_steps=steps, data_source=source,
                       experiment=experiment(mesh, total_steps, **(settings or {})), **kwargs)


def losses(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return {row["step"]: row["loss"] for row in map(json.loads, f) if "loss" in row}


def params_at(model_dir):
    _, step = store.locate(str(model_dir))
    return step, jax.device_get(store.restore_params(str(model_dir), None))
