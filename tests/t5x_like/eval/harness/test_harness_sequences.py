"""lm-eval requests as token sequences: the windows and the left cut are lm-eval's own, and packing keeps every
sequence's scored targets where scored_spans says they are."""
import numpy as np
import pytest

from t5x_like.eval.harness import sequences as seqs
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_POSITIONS, DECODER_SEGMENT_IDS, DECODER_TARGET_TOKENS

PREFIX = 999


@pytest.mark.parametrize("num_tokens, max_length", [(1, 4), (4, 4), (5, 4), (9, 4), (23, 8), (64, 8)])
def test_rolling_windows_with_the_whole_window_as_stride_are_lm_evals(num_tokens, max_length):
    lm_eval_utils = pytest.importorskip("lm_eval.utils", reason="needs the lm_eval extra")
    tokens = list(range(num_tokens))
    expected = [lm_eval_utils.make_disjoint_window(w) for w in lm_eval_utils.get_rolling_token_windows(
        tokens, prefix_token=PREFIX, max_seq_len=max_length, context_len=1)]
    ours = seqs.rolling(tokens, PREFIX, max_length, max_length)
    # lm-eval's backend reads (context + continuation)[:-1] and scores the continuation's tokens
    assert [(list(w.ids[:-1]), list(w.ids[-w.scored:])) for w in ours] == \
           [((c + p)[-(max_length + 1):][:-1], p) for c, p in expected]


@pytest.mark.parametrize("num_tokens, max_length, stride", [(30, 8, 3), (9, 8, 1), (50, 16, 5), (3, 8, 2)])
def test_strided_windows_score_every_token_once_with_enough_context(num_tokens, max_length, stride):
    tokens = list(range(num_tokens))
    windows = seqs.rolling(tokens, PREFIX, max_length, stride)
    scored = [t for w in windows for t in w.ids[-w.scored:]]
    assert scored == tokens
    assert all(w.length <= max_length for w in windows)
    assert all(w.length - w.scored >= max_length - stride for w in windows[1:])  # context before the scored ones


def test_a_long_request_loses_its_context_start_as_lm_evals_hf_backend_cuts_it():
    request = seqs.continuation(list(range(10)), [20, 21], max_length=6)
    assert request.ids == (5, 6, 7, 8, 9, 20, 21) and request.scored == 2
    with pytest.raises(ValueError):
        seqs.continuation([1], list(range(7)), max_length=6)


def test_packed_rows_hold_each_sequence_once_where_its_spans_say():
    rng = np.random.default_rng(0)
    sequences = [seqs.Scored(tuple(rng.integers(1, 50, n + 1)), int(rng.integers(1, n + 1)))
                 for n in rng.integers(1, 40, 30)]
    length = seqs.row_length(sequences, max_length=64)
    assert length == 64
    rows = seqs.pack(sequences, length)
    assert sorted(i for row in rows for i in row) == list(range(len(sequences)))
    assert len(rows) < len(sequences)  # short requests share rows
    batch = seqs.packed_rows(sequences, rows, len(rows) + 2, length)
    assert not batch[DECODER_SEGMENT_IDS][-2:].any()  # padding rows
    for index, (row, span) in seqs.scored_spans(sequences, rows).items():
        sequence = sequences[index]
        np.testing.assert_array_equal(batch[DECODER_TARGET_TOKENS][row, span], sequence.ids[-sequence.scored:])
        segment = batch[DECODER_SEGMENT_IDS][row, span.stop - 1]
        mine = batch[DECODER_SEGMENT_IDS][row] == segment
        np.testing.assert_array_equal(batch[DECODER_INPUT_TOKENS][row, mine], sequence.ids[:-1])
        np.testing.assert_array_equal(batch[DECODER_POSITIONS][row, mine], np.arange(sequence.length))


def test_row_lengths_are_few_buckets_capped_by_the_model():
    short, long = seqs.Scored(tuple(range(10)), 1), seqs.Scored(tuple(range(100)), 1)
    assert seqs.row_length([short], 2048) == seqs.MIN_ROW_LENGTH
    assert seqs.row_length([short, long], 2048) == 128
    assert seqs.row_length([long], 100) == 100
