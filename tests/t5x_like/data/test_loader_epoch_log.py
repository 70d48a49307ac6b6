"""Epochs are announced by the step that trains their first row, not when the loader reads ahead (grain's
read-ahead, worker processes): each batch's passes_begun against the rows it holds (one file, a blend, a batch-size
ramp-up), and the run's log lines against its steps, a resume mid-epoch included. Epochs count from 1 as users
count them (Keras, the Hugging Face Trainer and Megatron print "epoch 1" for the first pass)."""
import collections
import functools
import logging

import jax
import pytest

from partitioning import make_mesh

from t5x_like.data import SourceSettings, make_source
from t5x_like.data.passes import PassBegun
from t5x_like.data.rampup import BatchRampup
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS
from tests.support.training import run_train

SEQ_LEN = 4


def corpus(write_token_file, path, first_id: int, rows: int) -> str:
    """A token file whose training split is `rows` windows of SEQ_LEN, each opening with its own id."""
    return write_token_file(path, [list(range(first_id, first_id + rows * SEQ_LEN + 1))], vocab_size=256)


def train_source(paths, batch_size, rampup=None, **settings):
    return make_source("train", SourceSettings(data_path=paths, data_split="1,0,0", **settings), batch_size=batch_size,
                       feature_lengths={"targets": SEQ_LEN}, seed=0, shard_index=0, shard_count=1, rampup=rampup)


def passes_read(source, batches: int, names: dict) -> tuple[list, list]:
    """(what each batch's passes_begun says, what its trained rows show): a row's pass is the number of times it
    was trained before (each pass holds every row once); its file is named by its first id (`names`)."""
    seen, started, said, shown = collections.Counter(), collections.Counter(), [], []
    for _ in range(batches):
        batch = next(source)
        said.append(list(source.passes_begun))
        begun = []
        for row, weights in zip(batch[DECODER_INPUT_TOKENS], batch[DECODER_LOSS_WEIGHTS]):
            if weights.any():
                name, seen[int(row[0])] = names[int(row[0])], seen[int(row[0])] + 1
                if seen[int(row[0])] > max(started[name], 1):
                    begun.append((name, seen[int(row[0])]))
                started[name] = max(started[name], seen[int(row[0])])
        shown.append(begun)
    source.close()
    return [[(p.name, p.number) for p in batch] for batch in said], shown


def rows_of(path, first_id, rows) -> dict:
    return {first_id + SEQ_LEN * r: f"{path} (train)" for r in range(rows)}


@pytest.mark.parametrize("worker_count", [0, 1])
def test_one_files_epochs_begin_with_the_batch_holding_their_first_row(write_token_file, tmp_path, worker_count):
    path = corpus(write_token_file, tmp_path / "a", 1, rows=10)
    said, shown = passes_read(train_source(path, 4, worker_count=worker_count), 12, rows_of(path, 1, 10))
    assert said == shown
    assert [k for k, batch in enumerate(said, 1) if batch] == [3, 6, 8, 11]  # rows 10, 20, 30, 40 of 4 a step


def test_a_blends_files_each_count_their_own_epochs(write_token_file, tmp_path):
    a, b = corpus(write_token_file, tmp_path / "a", 1, rows=6), corpus(write_token_file, tmp_path / "b", 100, rows=5)
    names = rows_of(a, 1, 6) | rows_of(b, 100, 5)
    said, shown = passes_read(train_source([a, b], 4, blend_weights=[2.0, 1.0]), 15, names)
    assert said == shown
    assert {name for batch in said for name, _ in batch} == {f"{a} (train)", f"{b} (train)"}


def test_a_ramp_ups_epochs_begin_with_the_step_that_trains_their_first_row(write_token_file, tmp_path):
    path = corpus(write_token_file, tmp_path / "a", 1, rows=7)
    source = train_source(path, 8, rampup=BatchRampup(2, 2, 24, batch_size=8))
    said, shown = passes_read(source, 10, rows_of(path, 1, 7))
    assert said == shown and sum(map(len, said)) >= 5


def test_the_run_logs_each_epoch_at_its_step_once_and_none_it_did_not_train(write_token_file, tmp_path, caplog):
    """20 rows a pass, 8 a step: passes 2, 3, 4 begin at rows 20, 40, 60, in steps 3, 6 and 8. The run stops at
    step 6 (the loader has read ahead into pass 4) and resumes mid-epoch to step 8."""
    corpus_path = corpus(write_token_file, tmp_path / "a", 1, rows=20)
    data = functools.partial(make_source, settings=SourceSettings(data_path=corpus_path, data_split="1,0,0"))
    lines = []
    for steps in (6, 8):
        with caplog.at_level(logging.INFO):
            run_train(tmp_path / "run", data, steps=steps, mesh=make_mesh(data=1, devices=jax.devices()[:1]),
                settings={"feature_lengths": {"targets": SEQ_LEN}})
        lines.append([r.getMessage() for r in caplog.records if " epoch " in r.getMessage()])
        caplog.clear()
    name = f"{tmp_path / 'a'} (train)"
    assert lines == [[PassBegun(name, 2, 20).describe(3), PassBegun(name, 3, 20).describe(6)],
                     [PassBegun(name, 4, 20).describe(8)]]
    assert lines[0][0] == f"data: {name}: epoch 2 begins at step 3 (20 rows per epoch)"
