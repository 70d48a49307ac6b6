"""The train step (t5x_like.step_fns) run in-process on a mesh: a tiny GPT-2, its batches, and a loop over them.
tests/t5x_like/test_trainer.py and the tests that compare other settings with it (FP8, T5) share these.
The train() loop's helpers are in tests/support/training.py."""
import logging

import jax
import numpy as np

from models.gpt2 import GPT2Config
from t5x_like import optim
from t5x_like.experiment import ExperimentSettings, build_experiment
from t5x_like.features import DECODER_INPUT_TOKENS

SEQ_LEN = 16
# 8 heads and a vocabulary padded to 1024 so every mesh below divides the same parameters.
CONFIG = GPT2Config(vocab_size=256, max_len=SEQ_LEN, num_layers=2, num_heads=8, embed_dim=64, mlp_dim=256,
                    dropout_rate=0.0, attention_dropout_rate=0.0, vocab_pad_multiple=1024, dtype="float32")


def batches(source_cls, count, batch_size=8):
    source = source_cls("train", batch_size=batch_size, feature_lengths={"targets": SEQ_LEN}, seed=3, shard_index=0,
                        shard_count=1)
    return [next(source) for _ in range(count)]


TOTAL_STEPS = 20
"""The schedule's length for every run of 20 batches or fewer (test_train.py's too): runs of different lengths
on one mesh compile the same train step, which the suite's compilation cache shares between tests."""


def experiment(mesh, rules, data, *, config=CONFIG, feature_lengths=None, **settings):
    optimizer = optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=2)
    return build_experiment(ExperimentSettings(
        model=config, mesh=mesh, rules=rules, optimizer=optimizer, batch_size=len(data[0][DECODER_INPUT_TOKENS]),
        feature_lengths=feature_lengths or {"targets": SEQ_LEN}, **settings), train_steps=max(len(data), TOTAL_STEPS))


def run(mesh, rules, data, *, config=CONFIG, steps_between=None, **settings):
    """Train on `data` batches; returns per-step metrics and the final state."""
    exp = experiment(mesh, rules, data, config=config, **settings)
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
    `steps_between(i)` before step i, as `run` does."""
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
