"""seq2seq: pairs from JSONL, TSV and token files, padded and packed, cut to length with EOS; errors name the
file and the line."""
import json
import logging

import numpy as np
import pytest

from t5x_like.data.objectives import seq2seq
from t5x_like.data.token_file import TokenFileWriter
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.errors import UserError
from tests.t5x_like.data.objectives.helpers import (VOCAB, assert_same_batches, made_with, pair_source,
                                                    segments_of, span_source, take)


def write_pairs(path, pairs, fmt):
    if fmt == "jsonl":
        lines = [json.dumps({"inputs": i, "targets": t, "id": n}) for n, (i, t) in enumerate(pairs)]
        path.write_text("".join(line + "\n" for line in lines))
    else:
        path.write_text("id\tinputs\ttargets\n" + "".join(f"{n}\t{i}\t{t}\n" for n, (i, t) in enumerate(pairs)))
    return str(path)


@pytest.fixture(scope="module")
def pairs():
    """60 pairs of 1..90 input words and 1..25 target words; some longer than SMALL (64 / 14) and cut."""
    rng = np.random.default_rng(2)
    return [(" ".join(f"w{w}" for w in rng.integers(3, VOCAB, rng.integers(1, 90))),
             " ".join(f"w{w}" for w in rng.integers(3, VOCAB, rng.integers(1, 25)))) for _ in range(60)]


def ids(text, keep):
    return [int(w[1:]) for w in text.split()][:keep] + [1]


@pytest.mark.parametrize("fmt", ["jsonl", "tsv"])
def test_seq2seq_padded_rows_are_the_pairs_cut_to_length_with_eos(tmp_path, tokenizer_path, pairs, fmt, caplog):
    path = write_pairs(tmp_path / f"pairs.{fmt}", pairs, fmt)
    with caplog.at_level(logging.INFO):
        src = pair_source(path, "validation", data_split="1,1,0", tokenizer=tokenizer_path, batch_size=30)
    batch = next(src)
    assert set(batch) == {"encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens",
                          "decoder_loss_weights", "encoder_segment_ids"}
    assert src.vocab_size == VOCAB + 100 and src.tokenizer_path == tokenizer_path
    for row, (inputs, targets) in enumerate(pairs[30:]):  # the validation half, in order
        expected_inputs, expected_targets = ids(inputs, 63), ids(targets, 13)
        np.testing.assert_array_equal(batch["encoder_input_tokens"][row],
                                      np.pad(expected_inputs, (0, 64 - len(expected_inputs))))
        np.testing.assert_array_equal(batch["decoder_target_tokens"][row],
                                      np.pad(expected_targets, (0, 14 - len(expected_targets))))
        np.testing.assert_array_equal(batch["decoder_input_tokens"][row],
                                      np.pad([0] + expected_targets[:-1], (0, 14 - len(expected_targets))))
        np.testing.assert_array_equal(batch["decoder_loss_weights"][row], np.arange(14) < len(expected_targets))
        np.testing.assert_array_equal(batch["encoder_segment_ids"][row], np.arange(64) < len(expected_inputs))
    cut_inputs = sum(len(i.split()) >= 64 for i, _ in pairs[30:])
    cut_targets = sum(len(t.split()) >= 14 for _, t in pairs[30:])
    assert cut_inputs > 0 and cut_targets > 0
    assert any(f"30 pairs; {cut_inputs} inputs longer than 64 and {cut_targets} targets longer than 14" in
               r.getMessage() for r in caplog.records)


def test_seq2seq_packed_from_jsonl_equals_token_files_and_resumes(tmp_path, tokenizer_path, pairs):
    path = write_pairs(tmp_path / "pairs.jsonl", pairs, "jsonl")
    tokenizer = load_tokenizer(tokenizer_path)
    for field, index in (("inputs", 0), ("targets", 1)):
        encoded = [tokenizer.encode(pair[index]) for pair in pairs]
        metadata = {"tokenizer": made_with(tokenizer_path), "append_eod": False}
        with TokenFileWriter(tmp_path / f"pre.{field}", np.uint16, metadata) as writer:
            writer.write(np.concatenate(encoded), np.array([len(e) for e in encoded]))
    by_split = {"train": path, "validation": path}
    from_jsonl = take(pair_source(by_split, tokenizer=tokenizer_path, packing=True), 8)
    from_token_files = take(pair_source({"train": str(tmp_path / "pre")}, packing=True), 8)
    assert_same_batches(from_token_files, from_jsonl)
    seen = set()
    for batch in from_jsonl:
        for row in range(4):
            for inputs, targets in zip(segments_of(batch, row, "encoder"), segments_of(batch, row, "decoder")):
                seen.add((tuple(inputs), tuple(targets)))
    assert seen <= {(tuple(ids(i, 63)), tuple(ids(t, 13))) for i, t in pairs} and len(seen) > 20
    assert max(b["encoder_segment_ids"].max() for b in from_jsonl) > 1
    resumed = pair_source(by_split, tokenizer=tokenizer_path, packing=True)
    first = pair_source(by_split, tokenizer=tokenizer_path, packing=True)
    take(first, 3)
    resumed.set_state(json.loads(json.dumps(first.get_state())))
    assert_same_batches(take(resumed, 5), from_jsonl[3:])


@pytest.mark.parametrize("name, content, message", [
    ("bad.jsonl", '{"inputs": "w3", "targets": "w4"}\n\n{"inputs": "w3", "targets": \n',
     r"bad\.jsonl:3: invalid JSON at column 29"),
    ("bad.jsonl", '{"inputs": "w3", "targets": "w4"}\n{"inputs": "w3", "label": "w4"}\n',
     r"bad\.jsonl:2: no field 'targets' \(fields: inputs, label\)"),
    ("bad.jsonl", '{"inputs": "w3", "targets": 4}\n', r"bad\.jsonl:1: field 'targets' is int, expected a string"),
    ("bad.tsv", "question\ttargets\nw3\tw4\n", r"bad\.tsv:1: the header row names no column 'inputs'"),
    ("bad.tsv", "inputs\ttargets\nw3\tw4\nw3 w4\n", r"bad\.tsv:3: 1 tab-separated fields, but the header has 2"),
    ("bad.tsv", "", r"bad\.tsv: no pairs"),
    ("bad.jsonl", '{"inputs": "w3", "targets": "w4"}\n{"inputs": " ", "targets": "w4"}\n',
     r"bad\.jsonl:2: an empty 'inputs'; every pair needs text on both sides"),
    ("bad.tsv", "inputs\ttargets\nw3\tw4\nw3\t\n", r"bad\.tsv:3: an empty 'targets'"),
])
def test_bad_pairs_files_name_the_file_and_line(tmp_path, tokenizer_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(UserError, match=message):
        pair_source(str(tmp_path / name), tokenizer=tokenizer_path)


def test_seq2seq_configuration_errors(tmp_path, tokenizer_path, pairs):
    path = write_pairs(tmp_path / "pairs.jsonl", pairs, "jsonl")
    with pytest.raises(UserError, match=r"set TOKENIZER"):
        pair_source(path)
    with pytest.raises(UserError, match=r"names no files for the validation split"):
        pair_source({"train": path}, "validation", tokenizer=tokenizer_path)
    (tmp_path / "pairs.json").write_text("{}")
    with pytest.raises(UserError, match=r"pairs\.json: pairs must be in a file named \*\.jsonl or \*\.tsv"):
        pair_source(str(tmp_path / "pairs.json"), tokenizer=tokenizer_path)


@pytest.mark.system
def test_worker_processes_give_the_same_batches(corpus):
    prefix, _ = corpus
    expected = take(span_source(prefix, packing=True), 3)
    src = span_source(prefix, packing=True, worker_count=1)
    try:
        assert_same_batches(take(src, 3), expected)
    finally:
        src.close()


def test_pairs_errors_name_the_file_the_line_and_the_fix(tmp_path, tokenizer_path, pairs):
    (tmp_path / "empty_record.jsonl").write_text("{}\n")
    with pytest.raises(UserError) as raised:
        pair_source(str(tmp_path / "empty_record.jsonl"), tokenizer=tokenizer_path)
    assert str(raised.value) == (f"{tmp_path / 'empty_record.jsonl'}:1: no field 'inputs' (fields: none); each line "
                                 "needs string fields 'inputs' and 'targets'")
    path = write_pairs(tmp_path / "few.jsonl", pairs[:10], "jsonl")
    with pytest.raises(UserError, match=rf"^{path}: DATA_SPLIT=.100,0,0. leaves the validation split none"):
        pair_source(path, "validation", tokenizer=tokenizer_path, data_split="100,0,0")


@pytest.mark.parametrize("append_eod, side", [(True, "inputs"), (True, "targets"), (False, None)])
def test_pair_token_files_made_with_eod_are_refused(tmp_path, tokenizer_path, append_eod, side):
    """Token files of pairs must hold no EOD (preprocess --noappend_eod): the loader appends EOS after cutting."""
    prefix = str(tmp_path / "pairs")
    for name in ("inputs", "targets"):
        metadata = {"tokenizer": made_with(tokenizer_path), "append_eod": append_eod and name == side}
        with TokenFileWriter(f"{prefix}.{name}", np.uint16, metadata) as writer:
            writer.write(np.array([5, 6, 7, 8], np.int64), np.array([2, 2]))
    if side is None:
        inputs, targets = seq2seq._open_pair_files(prefix)
        assert inputs.num_documents == targets.num_documents == 2
        return
    with pytest.raises(UserError) as raised:
        seq2seq._open_pair_files(prefix)
    assert str(raised.value) == (f"{prefix}.{side}.json: made with EOD appended, but the loader appends EOS after "
                                 "cutting to FEATURE_LENGTHS; re-run preprocess with --noappend_eod")


