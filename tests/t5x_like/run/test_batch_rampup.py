"""BATCH_SIZE_RAMPUP, Megatron-LM's --rampup-batch-size: the schedule is Megatron's step by step (a port of its
RampupBatchsizeNumMicroBatchesCalculator and update_train_iters at a52112d); a ramp-up step trains as a step of its
smaller batch on the same rows, gradient accumulation too, without compiling anything after the first step; a run
stopped mid-ramp resumes exactly and logs each step's batch size."""
import functools
import json

import gin
import jax
import numpy as np
import pytest

from partitioning import make_mesh
from t5x_like.config import frontend
from t5x_like.data import SourceSettings, make_source
from t5x_like.data.rampup import BatchRampup, batch_rampup
from t5x_like.data.token_file import TokenFileWriter
from t5x_like.errors import UserError
from t5x_like.features import DECODER_LOSS_WEIGHTS
from tests.support import training


def megatron_batches(start, increment, samples, global_batch, steps):
    """(batch, samples consumed before it) of each step, as Megatron's calculator updates them."""
    per_increment = samples / ((global_batch - start) // increment)
    consumed, out = 0, []
    for _ in range(steps):
        batch = global_batch if consumed > samples else start + int(consumed / per_increment) * increment
        out.append((batch, consumed))
        consumed += batch
    return out


def megatron_train_iters(start, increment, samples, global_batch, train_samples):
    """megatron/training/training.py update_train_iters with --rampup-batch-size."""
    per_increment = samples / ((global_batch - start) // increment)
    iterations = consumed = 0
    while consumed <= samples and consumed <= train_samples:
        consumed += global_batch if consumed > samples else start + int(consumed / per_increment) * increment
        iterations += 1
    if train_samples > consumed:
        iterations += (train_samples - consumed) // global_batch
    return iterations


SETTINGS = [(4, 4, 64, 16), (2, 2, 10, 8), (32, 32, 6000, 256), (1, 3, 100, 16), (3, 1, 7, 12), (8, 8, 1000, 1024)]
"""(start, increment, samples, BATCH_SIZE): samples per increment 21.3, 3.3, 857.1, 20, 0.78 (the batch jumps
several increments a step), 7.9."""


@pytest.mark.parametrize("start, increment, samples, global_batch", SETTINGS)
def test_the_schedule_is_megatrons_step_by_step(start, increment, samples, global_batch):
    rampup = BatchRampup(start, increment, samples, batch_size=global_batch)
    steps = rampup.full_from + 5
    want = megatron_batches(start, increment, samples, global_batch, steps)
    assert [(rampup.batch_at(s), rampup.consumed_before(s)) for s in range(steps)] == want
    assert rampup.batch_at(rampup.full_from - 1) < global_batch == rampup.batch_at(rampup.full_from)
    rows = np.arange(steps * global_batch)
    np.testing.assert_array_equal(rampup.counted(rows), rows % global_batch < np.repeat([b for b, _ in want],
                                                                                        global_batch))
    for train_samples in (0, 1, samples - 1, samples, samples + 1, 3 * samples + 17):
        assert rampup.train_steps(train_samples) == megatron_train_iters(start, increment, samples, global_batch,
                                                                         train_samples), train_samples
        taken = rampup.steps_to_consume(train_samples)
        assert rampup.consumed_before(taken) >= train_samples and \
            (taken == 0 or rampup.consumed_before(taken - 1) < train_samples)


@pytest.mark.parametrize("setting, batch_size, message", [
    ((16, 4, 64), 16, r"BATCH_SIZE_RAMPUP=\(16, 4, 64\): the ramp starts at 16 rows, not below BATCH_SIZE=16.*divides "
                      r"by zero"),
    ((32, 4, 64), 16, r"the ramp starts at 32 rows, not below BATCH_SIZE=16"),
    ((4, 5, 64), 16, r"BATCH_SIZE=16 - start 4 = 12 is not a multiple of the increment 5"),
    ((4, 4, 0), 16, r"start, increment and samples must be positive"),
    ((0, 4, 64), 16, r"start, increment and samples must be positive"),
    ((4, 4), 16, r"BATCH_SIZE_RAMPUP=\(4, 4\): expected None or three whole numbers \(start, increment, samples\)"),
    ([4, 4, 6.5], 16, r"expected None or three whole numbers"),
])
def test_a_ramp_up_megatron_refuses_is_refused_in_one_line(setting, batch_size, message):
    with pytest.raises(UserError, match=message) as refused:
        batch_rampup(setting, batch_size)
    assert "\n" not in str(refused.value)


def test_no_setting_no_ramp_up():
    assert batch_rampup(None, 16) is None


def test_a_run_counted_in_epochs_cannot_ramp_up():
    gin.clear_config()
    try:
        with pytest.raises(UserError, match=r"EPOCHS=2 with BATCH_SIZE_RAMPUP: a pass over the data is no whole number"):
            frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='unused'", "EPOCHS=2", "BATCH_SIZE_RAMPUP=(4, 4, 64)"],
                              [])
    finally:
        gin.clear_config()


def write_corpus(prefix) -> str:
    """80 documents of 30 ids in 1..250, a fake tokenizer of 256 ids (the tiny models' vocabulary)."""
    documents = np.array([[(7 * d + t) % 250 + 1 for t in range(30)] for d in range(80)])
    made_with = {"path": "fake", "sha256": "0" * 64, "vocab_size": 256, "eod_id": 0}
    with TokenFileWriter(prefix, np.uint16, {"tokenizer": made_with}) as writer:
        writer.write(documents.reshape(-1), np.full(len(documents), documents.shape[1]))
    return str(prefix)


def ramped_batches(path, rampup, count):
    source = make_source("train", SourceSettings(data_path=path), batch_size=rampup.batch_size,
                         feature_lengths={"targets": training.SEQ_LEN}, seed=3, shard_index=0, shard_count=1,
                         rampup=rampup)
    return [next(source) for _ in range(count)]


@pytest.mark.integration
@pytest.mark.parametrize("grad_accum_steps", [1, 2])
def test_a_ramp_up_step_trains_as_a_step_of_its_smaller_batch(tmp_path, grad_accum_steps):
    """Step 0 of a ramp from 12 to 16 rows: 16 rows computed, 12 trained on; with two microbatches the second holds
    the 4 rows that count nothing. The same loss, gradient norm and update as a 12-row step on those rows."""
    rampup = BatchRampup(12, 4, 100, batch_size=16)
    [batch] = ramped_batches(write_corpus(tmp_path / "corpus"), rampup, 1)
    assert batch[DECODER_LOSS_WEIGHTS][:12].all() and not batch[DECODER_LOSS_WEIGHTS][12:].any()
    smaller = {key: value[:12] for key, value in batch.items()}
    mesh = make_mesh(data=2, fsdp=1, tensor=4)
    [got], got_state = training.run_steps(mesh, "fsdp_tensor", [batch], grad_accum_steps=grad_accum_steps)
    [want], want_state = training.run_steps(mesh, "fsdp_tensor", [smaller], grad_accum_steps=grad_accum_steps)
    assert got["tokens"] == want["tokens"] == 12 * training.SEQ_LEN
    np.testing.assert_allclose([got["loss"], got["grad_norm"]], [want["loss"], want["grad_norm"]], rtol=1e-5)
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-7),
                 jax.device_get(got_state.params), jax.device_get(want_state.params))


def test_nothing_recompiles_after_the_first_step_of_a_ramp_up(tmp_path):
    rampup = BatchRampup(2, 2, 20, batch_size=8)  # batches of 2, 2, 2, 4, 4, 6, ... rows
    data = ramped_batches(write_corpus(tmp_path / "corpus"), rampup, 6)
    compiled, (history, _) = training.compiled_after_first_step(functools.partial(
        training.run_steps, make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor", data))
    assert compiled == []
    assert [m["tokens"] for m in history] == [rampup.batch_at(s) * training.SEQ_LEN for s in range(6)]


def metrics_rows(model_dir):
    with open(model_dir / "metrics.jsonl") as f:
        return [row for row in map(json.loads, f) if "loss" in row]


@pytest.mark.integration
def test_a_run_stopped_mid_ramp_resumes_exactly_and_logs_each_steps_batch(tmp_path):
    source = functools.partial(make_source, settings=SourceSettings(data_path=write_corpus(tmp_path / "corpus")))
    settings = {"batch_size_rampup": (2, 2, 12)}  # 2, 2, 4, 6, 8, 8 rows: steps 0 .. 5
    training.run_train(tmp_path / "straight", source, steps=6, checkpoint_every=3, settings=settings)
    training.run_train(tmp_path / "resumed", source, steps=3, checkpoint_every=3, settings=settings)
    training.run_train(tmp_path / "resumed", source, steps=6, checkpoint_every=3, settings=settings)
    straight, resumed = metrics_rows(tmp_path / "straight"), metrics_rows(tmp_path / "resumed")
    assert [row["batch_size"] for row in straight] == [2, 2, 4, 6, 8, 8]
    assert [(row["step"], row["loss"], row["batch_size"]) for row in resumed] == \
        [(row["step"], row["loss"], row["batch_size"]) for row in straight]
    with pytest.raises(UserError, match=r"this run reads with BATCH_SIZE_RAMPUP=None"):
        training.run_train(tmp_path / "resumed", source, steps=7, checkpoint_every=3)
