"""The loader over token files: windows, packing, shuffling, splits, blends, hosts and exact resume."""
import json
import logging

import numpy as np
import pytest

from t5x_like.data import SourceSettings, make_source
from t5x_like.data.loader import DataChangedError, split_documents
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS, DECODER_SEGMENT_IDS, DECODER_TARGET_TOKENS
from t5x_like.errors import UserError


def source(path, split="train", *, batch_size=4, seq_len=16, seed=0, shard_index=0, shard_count=1, **configured):
    return make_source(split, SourceSettings(data_path=path, **configured), batch_size=batch_size,
                       feature_lengths={"targets": seq_len}, seed=seed, shard_index=shard_index,
                       shard_count=shard_count)


def take(src, steps):
    return [next(src) for _ in range(steps)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def test_windows_cover_the_train_split_once_per_epoch(numbered_file, numbered_documents):
    stream = np.concatenate(numbered_documents[:int(round(200 * 949 / 1000))])
    rows_per_epoch = (len(stream) - 1) // 16
    src = source(numbered_file, batch_size=rows_per_epoch)
    batch = next(src)
    assert set(batch) == {DECODER_INPUT_TOKENS, DECODER_TARGET_TOKENS, DECODER_LOSS_WEIGHTS}
    assert batch[DECODER_INPUT_TOKENS].dtype == batch[DECODER_TARGET_TOKENS].dtype == np.int32 and batch[DECODER_LOSS_WEIGHTS].dtype == np.float32
    np.testing.assert_array_equal(batch[DECODER_INPUT_TOKENS][:, 1:], batch[DECODER_TARGET_TOKENS][:, :-1])
    assert (batch[DECODER_LOSS_WEIGHTS] == 1).all()
    starts = sorted(int(np.flatnonzero(stream == row[0])[0]) for row in batch[DECODER_INPUT_TOKENS])
    assert starts == list(range(0, rows_per_epoch * 16, 16))  # each window exactly once, in shuffled order
    assert [row[0] for row in batch[DECODER_INPUT_TOKENS]] != sorted(row[0] for row in batch[DECODER_INPUT_TOKENS])
    second_epoch = next(src)[DECODER_INPUT_TOKENS]
    assert {tuple(r) for r in second_epoch} == {tuple(r) for r in batch[DECODER_INPUT_TOKENS]}
    assert not np.array_equal(second_epoch, batch[DECODER_INPUT_TOKENS])  # reshuffled


def test_seed_changes_the_order_and_only_the_order(numbered_file):
    a, b = next(source(numbered_file, seed=1)), next(source(numbered_file, seed=2))
    assert not np.array_equal(a[DECODER_INPUT_TOKENS], b[DECODER_INPUT_TOKENS])
    assert_same_batches([next(source(numbered_file, seed=1))], [a])


@pytest.mark.parametrize("packing", [False, True])
def test_resume_continues_exactly_without_replay(numbered_file, packing):
    uninterrupted = take(source(numbered_file, packing=packing), 12)
    first = source(numbered_file, packing=packing)
    take(first, 5)
    state = json.loads(json.dumps(first.get_state()))
    resumed = source(numbered_file, packing=packing)
    resumed.set_state(state)
    assert_same_batches(take(resumed, 7), uninterrupted[5:])


def rows_of(batches):
    return np.concatenate([b[DECODER_INPUT_TOKENS] for b in batches])


@pytest.mark.parametrize("packing", [False, True])
def test_a_resume_with_another_batch_size_continues_at_the_next_unseen_row(numbered_file, packing, caplog):
    """The position is in rows: 5 batches of 4 rows read, then 8 rows a step on 2 hosts (4 each) read rows
    20.. of the same stream, said once; the state saved then resumes exactly again."""
    uninterrupted = rows_of(take(source(numbered_file, packing=packing), 9))
    first = source(numbered_file, packing=packing)
    take(first, 5)
    state = json.loads(json.dumps(first.get_state()))
    assert state["rows"] == 20 and state["global_batch"] == 4
    hosts = [source(numbered_file, packing=packing, shard_index=h, shard_count=2) for h in range(2)]
    with caplog.at_level(logging.WARNING):
        for host in hosts:
            host.set_state(state)
    assert "this one reads 8 (BATCH_SIZE, or the hosts): continuing at row 20, the first it has not trained on" \
        in caplog.text
    steps = [take(host, 2) for host in hosts]
    both = np.concatenate([rows_of([steps[0][i], steps[1][i]]) for i in range(2)])
    np.testing.assert_array_equal(both, uninterrupted[20:36])
    again = source(numbered_file, packing=packing, shard_index=1, shard_count=2)
    again.set_state(json.loads(json.dumps(hosts[1].get_state())))
    assert_same_batches(take(again, 1), take(hosts[1], 1))


def test_a_resume_with_another_seq_len_starts_about_as_many_tokens_in(numbered_file, caplog):
    first = source(numbered_file, seq_len=16)
    take(first, 6)  # 24 rows of 16 tokens
    longer = source(numbered_file, seq_len=32)
    with caplog.at_level(logging.WARNING):
        longer.set_state(first.get_state())
    assert "FEATURE_LENGTHS={'targets': 16}, this one {'targets': 32}" in caplog.text
    assert longer.get_state()["rows"] == 12
    np.testing.assert_array_equal(rows_of(take(longer, 1)), rows_of(take(source(numbered_file, seq_len=32), 4))[12:16])


def test_a_resume_on_other_data_is_refused_naming_what_changed(tmp_path, numbered_file, numbered_documents,
                                                                write_token_file):
    """The corpus preprocessed again under the same prefix, another tokenizer or DATA_SPLIT: one line naming the
    change and the fix; the same content under another name (the data moved) resumes."""
    src = source(numbered_file)
    take(src, 3)
    state = src.get_state()
    write_token_file(tmp_path / "numbered", numbered_documents[:150], vocab_size=1 << 20)  # preprocessed again
    with pytest.raises(DataChangedError, match=r"data file 1 \(.*numbered\): .* bytes then, .* now\. Resuming "
                                               r"would continue at row 12 of other data.*train\.restart_data=True"):
        source(numbered_file).set_state(state)
    moved = write_token_file(tmp_path / "moved", numbered_documents, vocab_size=1 << 20)
    again = source(moved)
    again.set_state(state)
    assert again.get_state()["rows"] == 12
    with pytest.raises(DataChangedError, match=r"data_split \('949,50,1' then, '98,2,0' now\)"):
        source(moved, data_split="98,2,0").set_state(state)
    other_tokenizer = {"path": "other", "sha256": "1" * 64, "vocab_size": 1 << 20, "eod_id": 0}
    retokenized = write_token_file(tmp_path / "retok", numbered_documents, tokenizer=other_tokenizer)
    with pytest.raises(DataChangedError, match=r"the tokenizer \(sha256 000000000000… then, 111111111111… now\)"):
        source(retokenized).set_state(state)


def test_an_older_checkpoints_grain_state_still_resumes(numbered_file):
    uninterrupted = take(source(numbered_file), 5)
    older = source(numbered_file)
    older.set_state({"next_index": 3})  # what checkpoints held before the position was kept in rows
    assert_same_batches(take(older, 2), uninterrupted[3:])


@pytest.mark.parametrize("packing", [False, True])
def test_two_hosts_read_disjoint_halves_of_the_global_batch(numbered_file, tmp_path, write_token_file, packing):
    other = write_token_file(tmp_path / "other", [[7] * n for n in range(3, 80)], vocab_size=1 << 20)
    kwargs = dict(packing=packing, blend_weights=[0.6, 0.4])
    single = take(source([numbered_file, other], batch_size=8, **kwargs), 6)
    hosts = [take(source([numbered_file, other], batch_size=4, shard_index=h, shard_count=2, **kwargs), 6)
             for h in range(2)]
    for step, whole in enumerate(single):
        joined = {k: np.concatenate([hosts[0][step][k], hosts[1][step][k]]) for k in whole}
        assert_same_batches([joined], [whole])


def test_packing_never_crosses_a_document_boundary_unmarked(numbered_file):
    batch = next(source(numbered_file, batch_size=64, seq_len=32, packing=True))
    tokens = np.concatenate([batch[DECODER_INPUT_TOKENS], batch[DECODER_TARGET_TOKENS][:, -1:]], axis=1)
    segments, positions, weights = batch[DECODER_SEGMENT_IDS], batch[DECODER_POSITIONS], batch[DECODER_LOSS_WEIGHTS]
    document, offset = tokens // 1000, tokens % 1000 - 1
    seen_split_document = False
    for r in range(len(tokens)):
        for segment in np.unique(segments[r][segments[r] > 0]):
            where = np.flatnonzero(segments[r] == segment)
            assert len(set(document[r, where])) == 1, "one segment holds two documents"
            np.testing.assert_array_equal(positions[r, where], offset[r, where] - offset[r, where[0]])
            seen_split_document |= offset[r, where[0]] > 0
        same = (document[r, 1:] == document[r, :-1]) & (segments[r] > 0)
        np.testing.assert_array_equal(weights[r], same.astype(np.float32))
        assert (positions[r][segments[r] == 0] == 0).all()
    assert seen_split_document, "documents longer than a row (up to 60 > 33 tokens) must be cut into pieces"
    assert (segments > 1).any() and (segments == 0).any()


def test_packing_keeps_every_token_of_the_split(numbered_file, numbered_documents):
    train_documents = numbered_documents[:int(round(200 * 949 / 1000))]
    src = source(numbered_file, split="train", batch_size=1, seq_len=32, packing=True)
    seen = []
    for _ in range(400):  # more than one epoch of rows
        batch = next(src)
        row = np.concatenate([batch[DECODER_INPUT_TOKENS][0], batch[DECODER_TARGET_TOKENS][0, -1:]])
        seen.extend(row[row > 0].tolist())  # padding is id 0, which no numbered document holds
    expected = sorted(np.concatenate(train_documents).tolist())
    assert sorted(set(seen)) == expected


@pytest.mark.parametrize("ratios, sizes", [("949,50,1", (190, 10, 0)), ("8,1,1", (160, 20, 20)),
                                           ("1,1,0", (100, 100, 0))])
def test_document_split_proportions(ratios, sizes):
    splits = zip(("train", "validation", "test"), sizes)
    ranges = [split_documents(ratios, 200, split, "f") if n else None for split, n in splits]
    assert [r[1] - r[0] if r else 0 for r in ranges] == list(sizes)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]) if a and b)


def test_empty_split_and_bad_ratio_are_clear_errors(numbered_file):
    with pytest.raises(ValueError, match=r"DATA_SPLIT='949,50,1' leaves the test split none of its 200 documents"):
        source(numbered_file, split="test")
    with pytest.raises(ValueError, match=r"DATA_SPLIT='90,10': expected three non-negative ratios"):
        source(numbered_file, data_split="90,10")


def test_train_and_validation_documents_are_disjoint(numbered_file):
    def documents(split):
        src = source(numbered_file, split, data_split="8,1,1")
        rows = np.concatenate([b[DECODER_INPUT_TOKENS] for b in take(src, src.num_batches or 30)])
        return set((rows // 1000).ravel().tolist())
    train, validation, test = documents("train"), documents("validation"), documents("test")
    assert max(train) < min(validation) and max(validation) < min(test)
    assert not train & validation and not validation & test


def test_blend_proportions_follow_the_weights(tmp_path, write_token_file):
    a = write_token_file(tmp_path / "a", [[1] * 40] * 50, vocab_size=10)
    b = write_token_file(tmp_path / "b", [[2] * 40] * 50, vocab_size=10)
    rows = np.concatenate([x[DECODER_INPUT_TOKENS] for x in take(source([a, b], blend_weights=[0.25, 0.75], batch_size=50), 8)])
    share_of_a = np.mean(rows[:, 0] == 1)
    assert share_of_a == pytest.approx(0.25, abs=0.03)
    with pytest.raises(UserError, match=r"blend_weights=\[0\.0, 1\.0\]: every weight must be positive"):
        source([a, b], blend_weights=[0.0, 1.0], batch_size=50)


@pytest.mark.parametrize("packing", [False, True])
def test_validation_reads_every_row_once_in_order_on_every_host(numbered_file, packing):
    """One pass, in file order: the batches end after ceil(rows / global batch); the rows that fill up the
    last global batch count nothing; the hosts' real rows are the split's rows, each once; reset starts over."""
    whole = source(numbered_file, "validation", data_split="1,1,0", batch_size=1000, seq_len=64, packing=packing)
    (everything,) = take(whole, whole.num_batches)
    real = everything[DECODER_LOSS_WEIGHTS].sum(axis=1) > 0
    rows = everything[DECODER_INPUT_TOKENS][real]
    assert 20 < len(rows) < 1000
    hosts = [source(numbered_file, "validation", data_split="1,1,0", batch_size=3, seq_len=64, packing=packing,
                    shard_index=i, shard_count=2) for i in range(2)]
    assert hosts[0].num_batches == hosts[1].num_batches == -(-len(rows) // 6)
    batches = [take(host, host.num_batches) for host in hosts]
    with pytest.raises(StopIteration):
        next(hosts[0])
    seen = np.concatenate([np.concatenate([a[DECODER_INPUT_TOKENS], b[DECODER_INPUT_TOKENS]])
                           for a, b in zip(*batches)])
    weights = np.concatenate([np.concatenate([a[DECODER_LOSS_WEIGHTS], b[DECODER_LOSS_WEIGHTS]])
                              for a, b in zip(*batches)])
    np.testing.assert_array_equal(seen[:len(rows)], rows)
    np.testing.assert_array_equal(weights[:len(rows)], everything[DECODER_LOSS_WEIGHTS][real])
    assert len(seen) > len(rows) and not weights[len(rows):].any()  # filled up, counting nothing
    hosts[0].reset()
    assert_same_batches(take(hosts[0], 1), batches[0][:1])


def test_validation_of_blended_files_reads_each_file_once(tmp_path, write_token_file):
    a = write_token_file(tmp_path / "a", [[1] * 40] * 20, vocab_size=10)
    b = write_token_file(tmp_path / "b", [[2] * 40] * 30, vocab_size=10)
    src = source([a, b], "validation", blend_weights=[0.9, 0.1], data_split="0,1,0", batch_size=7, seq_len=10)
    batches = take(src, src.num_batches)
    counted = np.concatenate([x[DECODER_INPUT_TOKENS][x[DECODER_LOSS_WEIGHTS].sum(axis=1) > 0] for x in batches])
    assert (np.sum(counted[:, 0] == 1), np.sum(counted[:, 0] == 2)) == (20 * 40 // 10 - 1, 30 * 40 // 10 - 1)


def test_tokenizer_other_than_the_files_is_an_error(numbered_file, shared_data):
    with pytest.raises(ValueError, match=r"numbered\.json: tokenized with fake .* but TOKENIZER=.*gpt2-bpe is a "
                                         r"different vocabulary"):
        source(numbered_file, tokenizer=str(shared_data / "gpt2-bpe"))


def test_megatron_files_need_a_tokenizer(tmp_path, numbered_documents, write_token_file, shared_data):
    fits = write_token_file(tmp_path / "fits", numbered_documents[:50], vocab_size=50257)  # ids < 50,000
    for suffix in (".bin", ".idx"):
        (tmp_path / f"megatron{suffix}").write_bytes(open(fits + suffix, "rb").read())
    with pytest.raises(ValueError, match=r"megatron: no .*megatron\.json metadata .*set TOKENIZER"):
        source(str(tmp_path / "megatron"))
    src = source(str(tmp_path / "megatron"), tokenizer=str(shared_data / "gpt2-bpe"))
    assert (src.vocab_size, src.eod_id, src.tokenizer_path) == (50257, 50256, str(shared_data / "gpt2-bpe"))
    assert_same_batches([next(src)], [next(source(fits))])


def test_megatron_ids_beyond_the_tokenizer_are_named(tmp_path, numbered_file, shared_data):
    for suffix in (".bin", ".idx"):
        (tmp_path / f"megatron{suffix}").write_bytes(open(numbered_file + suffix, "rb").read())
    with pytest.raises(ValueError, match=r"megatron\.bin: token id \d+ at position \d+ is outside the vocabulary "
                                         r"of .*gpt2-bpe \(50257 ids\)"):
        source(str(tmp_path / "megatron"), tokenizer=str(shared_data / "gpt2-bpe"))


@pytest.mark.system
def test_worker_processes_give_the_same_batches_and_resume(numbered_file):
    expected = take(source(numbered_file, packing=True), 6)
    src = source(numbered_file, packing=True, worker_count=2)
    try:
        assert_same_batches(take(src, 3), expected[:3])
        state = json.loads(json.dumps(src.get_state()))
    finally:
        src.close()
    resumed = source(numbered_file, packing=True, worker_count=2)
    try:
        resumed.set_state(state)
        assert_same_batches(take(resumed, 3), expected[3:])
    finally:
        resumed.close()


def test_a_data_split_without_validation_names_eval_every():

    with pytest.raises(UserError, match=r"corpus: DATA_SPLIT=.100,0,0. leaves the validation split none of its 10 documents; "
                                        r"give it a larger ratio \(or train without validation: EVAL_EVERY=0\)"):
        split_documents("100,0,0", 10, "validation", "corpus")


def test_walk_rows_crosses_plan_windows(monkeypatch):
    """The packing plan's walk, a window of jumps at a time, equals a plain walk whatever the window."""
    from t5x_like.data import packing
    rng = np.random.default_rng(0)
    n = 100
    next_row = np.minimum(np.arange(n + 1) + rng.integers(1, 5, n + 1), n)
    want, i = [], 0
    while i < n:
        want.append(i)
        i = int(next_row[i])
    for window in (7, 1 << 20):
        monkeypatch.setattr(packing, "_PLAN_WINDOW", window)
        got = packing.walk_rows(next_row)
        assert got.dtype == np.int64 and got.tolist() == want + [n], window


def test_packed_rows_and_their_arrays_equal_a_next_fit_reference():
    """Documents of 5, 7, 18 and 10 tokens in rows of 10 (SEQ_LEN 9): the 18 splits into 10 + 8 and each row
    takes pieces while they fit (next fit); int32 tokens, segments 1, 2, ... (0 = padding), positions per
    piece; packed_arrays / window_arrays shift them into inputs and targets."""
    from t5x_like.data import loader
    tokens = np.arange(1, 41, dtype=np.uint16)
    rows = loader.PackedRows(tokens, np.array([0, 5, 12, 30, 40]), 9)
    pieces_per_row = [[(0, 5)], [(5, 12)], [(12, 22)], [(22, 30)], [(30, 40)]]
    assert len(rows) == len(pieces_per_row)
    for i, pieces in enumerate(pieces_per_row):
        row = rows[i]
        want_tokens = np.concatenate([tokens[a:b] for a, b in pieces]).astype(np.int32)
        want_segments = np.concatenate([np.full(b - a, k + 1) for k, (a, b) in enumerate(pieces)])
        want_positions = np.concatenate([np.arange(b - a) for a, b in pieces])
        n = len(want_tokens)
        for name, want in (("tokens", want_tokens), ("segments", want_segments), ("positions", want_positions)):
            assert row[name].dtype == np.int32, name
            np.testing.assert_array_equal(row[name], np.pad(want, (0, 10 - n)), err_msg=f"row {i} {name}")
    two = loader.PackedRows(tokens[:9], np.array([0, 3, 9]), 9)[0]  # documents of 3 and 6 share one row
    np.testing.assert_array_equal(two["segments"], [1, 1, 1, 2, 2, 2, 2, 2, 2, 0])
    np.testing.assert_array_equal(two["positions"], [0, 1, 2, 0, 1, 2, 3, 4, 5, 0])
    batch = {k: np.stack([two[k], rows[0][k]]) for k in two}
    packed = loader.packed_arrays(batch)
    np.testing.assert_array_equal(packed[DECODER_LOSS_WEIGHTS],
                                  [[1, 1, 0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed[DECODER_TARGET_TOKENS], batch["tokens"][:, 1:])
    np.testing.assert_array_equal(packed[DECODER_SEGMENT_IDS], batch["segments"][:, :-1])
    np.testing.assert_array_equal(packed[DECODER_POSITIONS], batch["positions"][:, :-1])
    windows = loader.window_arrays({"tokens": batch["tokens"]})
    np.testing.assert_array_equal(windows[DECODER_INPUT_TOKENS], batch["tokens"][:, :-1])
    np.testing.assert_array_equal(windows[DECODER_TARGET_TOKENS], batch["tokens"][:, 1:])
    assert windows[DECODER_LOSS_WEIGHTS].dtype == np.float32
    np.testing.assert_array_equal(windows[DECODER_LOSS_WEIGHTS], np.ones((2, 9)))


def test_a_split_shorter_than_one_row_names_the_file_and_split(tmp_path, write_token_file):
    prefix = write_token_file(tmp_path / "tiny", [[1, 2, 3], [4, 5, 6, 7]])
    with pytest.raises(UserError) as raised:
        source(prefix, seq_len=16, data_split="100,0,0")
    assert str(raised.value) == (f"{prefix} (train): 7 tokens, fewer than one row of SEQ_LEN+1 = 17; lower SEQ_LEN "
                                 "or give the split more documents")


@pytest.mark.parametrize("objective,setting,own", [("causal_lm", "mask_rate", "tfds_name, tfds_data_dir"),
                                                   ("mlm", "noise_density", "mask_rate, whole_word_masking"),
                                                   ("seq2seq", "labels", "fields")])
def test_a_setting_the_objective_does_not_take_names_the_ones_it_does(objective, setting, own):
    """data.make_source.<setting> in gin: a setting of another objective is one line naming this one's own."""
    with pytest.raises(UserError, match=rf"^data.make_source.{setting}: OBJECTIVE='{objective}' has no setting "
                                        rf"'{setting}'; its own settings: {own}"):
        make_source("train", SourceSettings(objective=objective, **{setting: 0.5}), batch_size=2,
                    feature_lengths={"targets": 8}, seed=0, shard_index=0, shard_count=1)
