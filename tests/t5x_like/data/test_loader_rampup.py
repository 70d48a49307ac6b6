"""A batch-size ramp-up's training batches (BATCH_SIZE_RAMPUP): global batch s holds the b(s) rows step s trains on,
the next ones of the stream, then rows that count nothing, on every host; the position resumes exactly and a resume
that would change the rows is refused in one line."""
import json

import numpy as np
import pytest

from t5x_like.data import SourceSettings, make_source
from t5x_like.data.counted_rows import PaddingRows
from t5x_like.data.rampup import BatchRampup
from t5x_like.errors import UserError
from t5x_like.features import CLASSIFICATION_LABELS, DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, NO_LABEL
from t5x_like.run import resume

RAMPUP = BatchRampup(2, 2, 10, batch_size=8)  # 2, 2, 4, 6, then 8 rows: 10 / 3 samples per increment


def ramped(path, *, shard_index=0, shard_count=1, rampup=RAMPUP, global_batch=8, seq_len=16):
    return make_source("train", SourceSettings(data_path=path), batch_size=global_batch // shard_count,
                       feature_lengths={"targets": seq_len}, seed=0, shard_index=shard_index, shard_count=shard_count,
                       rampup=rampup)


def stream_rows(path, count):
    """The training stream's first `count` rows, one per batch of a single-row source."""
    plain = make_source("train", SourceSettings(data_path=path), batch_size=1, feature_lengths={"targets": 16}, seed=0,
                        shard_index=0, shard_count=1)
    return [next(plain)[DECODER_INPUT_TOKENS][0] for _ in range(count)]


def test_each_step_holds_its_rows_of_the_stream_then_rows_that_count_nothing_on_every_host(numbered_file):
    hosts = [ramped(numbered_file, shard_index=i, shard_count=2) for i in range(2)]
    stream = stream_rows(numbered_file, 80)
    for step in range(8):
        parts = [next(host) for host in hosts]
        tokens = np.concatenate([p[DECODER_INPUT_TOKENS] for p in parts])
        weights = np.concatenate([p[DECODER_LOSS_WEIGHTS] for p in parts])
        first, rows = RAMPUP.consumed_before(step), RAMPUP.batch_at(step)
        np.testing.assert_array_equal(tokens[:rows], stream[first:first + rows], err_msg=f"step {step}")
        assert (weights[:rows] == 1).all() and (weights[rows:] == 0).all(), step
    assert [RAMPUP.batch_at(s) for s in range(6)] == [2, 2, 4, 6, 8, 8]


def test_rows_past_a_steps_batch_have_no_label_for_classification():
    """Classification marks a row that counts nothing with NO_LABEL: step 2 of the ramp trains on 4 of 8 rows;
    this is the second host's half (rows 4..7)."""
    batch = {CLASSIFICATION_LABELS: np.arange(4, dtype=np.int32)[:, None], DECODER_LOSS_WEIGHTS: np.ones((4, 3))}
    padded = PaddingRows(RAMPUP.counted, 4, shard_index=1, shard_count=2)(2, batch)
    assert (padded[CLASSIFICATION_LABELS] == NO_LABEL).all() and (padded[DECODER_LOSS_WEIGHTS] == 0).all()
    counted = PaddingRows(RAMPUP.counted, 4, shard_index=0, shard_count=2)(2, batch)
    np.testing.assert_array_equal(counted[CLASSIFICATION_LABELS][:, 0], [0, 1, 2, 3])


def test_a_resume_mid_ramp_continues_exactly(numbered_file):
    source = ramped(numbered_file)
    uninterrupted = [next(source) for _ in range(7)]
    first = ramped(numbered_file)
    for _ in range(3):
        next(first)
    resumed = ramped(numbered_file)
    resumed.set_state(json.loads(json.dumps(first.get_state())))
    for want in uninterrupted[3:]:
        got = next(resumed)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)


@pytest.mark.parametrize("changed, message", [
    (dict(rampup=None), r"read with BATCH_SIZE_RAMPUP=\(2, 2, 10\) .* this run reads with BATCH_SIZE_RAMPUP=None"),
    (dict(rampup=BatchRampup(4, 2, 10, batch_size=8)), r"this run reads with BATCH_SIZE_RAMPUP=\(4, 2, 10\)"),
    (dict(rampup=BatchRampup(2, 2, 10, batch_size=4), global_batch=4), r"\(BATCH_SIZE=4, "),
    (dict(seq_len=8), r"FEATURE_LENGTHS=\{'targets': 8\}\): a ramp-up's rows follow from these"),
])
def test_a_resume_that_would_change_a_ramp_ups_rows_is_refused_in_one_line(numbered_file, changed, message):
    first = ramped(numbered_file)
    next(first)
    with pytest.raises(UserError, match=message) as refused:
        ramped(numbered_file, **changed).set_state(first.get_state())
    assert "\n" not in str(refused.value)


def test_a_ramp_up_resumed_without_one_is_refused(numbered_file):
    plain = make_source("train", SourceSettings(data_path=numbered_file), batch_size=8, feature_lengths={"targets": 16},
                        seed=0, shard_index=0, shard_count=1)
    next(plain)
    with pytest.raises(UserError, match=r"with BATCH_SIZE_RAMPUP=None .* reads with BATCH_SIZE_RAMPUP=\(2, 2, 10\)"):
        ramped(numbered_file).set_state(plain.get_state())


def test_restarting_the_data_of_a_ramp_up_is_refused(numbered_file):
    source = ramped(numbered_file)
    with pytest.raises(UserError, match=r"train.restart_data=True with BATCH_SIZE_RAMPUP set"):
        resume.resume_data(source, source.get_state(), True, ramping=True)


def test_a_tfds_stream_cannot_ramp_up():
    with pytest.raises(UserError, match=r"BATCH_SIZE_RAMPUP: the TFDS stream wikitext"):
        make_source("train", SourceSettings(tfds_name="wikitext", tokenizer="unused"), batch_size=8,
                    feature_lengths={"targets": 16}, seed=0, shard_index=0, shard_count=1, rampup=RAMPUP)
