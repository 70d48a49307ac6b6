"""T5 objectives: span corruption (T5's lengths, noise statistics, sentinels, exact reconstruction, packing,
resume) and seq2seq pairs (JSONL, TSV, token files; padded and packed; errors naming file and line)."""
import json
import logging

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from t5x_like.data import objectives
from t5x_like.data import tokenizer_vocab_size
from t5x_like.data.objectives import make_seq2seq_source, make_span_corruption_source
from t5x_like.data.token_file import TokenFileWriter
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.errors import UserError

VOCAB = 1000  # synthetic word-level vocabulary: <pad> 0, </s> 1, <unk> 2, w3 .. w999
SENTINEL_0 = VOCAB + objectives.NUM_EXTRA_IDS - 1
SMALL = {"inputs": 64, "targets": 14}  # raw examples of 70 tokens (random_spans_helper)


def word_tokenizer(path, extra_ids=()):
    """A word-level tokenizer.json: 'w5 w7' -> [5, 7]; `extra_ids` names pieces placed at the given ids."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    for name, piece_id in extra_ids:
        vocab = {k: v for k, v in vocab.items() if v != piece_id} | {name: piece_id}
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer") / "words.json")


def made_with(tokenizer_path):
    loaded = load_tokenizer(tokenizer_path)
    return {"path": tokenizer_path, "sha256": loaded.sha256, "vocab_size": loaded.vocab_size, "eod_id": loaded.eod_id}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tokenizer_path):
    """300 documents of 1..400 random word ids (never 0-2 nor a sentinel), as a token file; (prefix, documents)."""
    rng = np.random.default_rng(0)
    documents = [rng.integers(3, VOCAB, n).tolist() for n in rng.integers(1, 400, 300)]
    prefix = tmp_path_factory.mktemp("corpus") / "docs"
    lengths = np.array([len(d) for d in documents])
    with TokenFileWriter(prefix, np.uint16, {"tokenizer": made_with(tokenizer_path)}) as writer:
        writer.write(np.concatenate(documents), lengths)
    return str(prefix), documents


def span_source(prefix, split="train", *, batch_size=8, feature_lengths=SMALL, seed=0, shard_index=0,
                shard_count=1, **configured):
    return make_span_corruption_source(split, batch_size=batch_size, feature_lengths=feature_lengths, seed=seed,
                                       shard_index=shard_index, shard_count=shard_count, data_path=prefix,
                                       **configured)


def pair_source(data_path, split="train", *, batch_size=4, feature_lengths=SMALL, **configured):
    return make_seq2seq_source(split, batch_size=batch_size, feature_lengths=feature_lengths, seed=0,
                               shard_index=0, shard_count=1, data_path=data_path, **configured)


def take(src, steps):
    return [next(src) for _ in range(steps)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def segments_of(batch, row, side):
    """[tokens of example 1, tokens of example 2, ...] of one row's encoder or decoder (id 0 is only padding)."""
    tokens = batch["encoder_input_tokens" if side == "encoder" else "decoder_target_tokens"][row]
    segment_ids = batch[f"{side}_segment_ids"][row] if f"{side}_segment_ids" in batch else (tokens != 0)
    return [tokens[segment_ids == s] for s in range(1, segment_ids.max() + 1)]


def reconstruct(inputs, targets, first_sentinel=SENTINEL_0):
    """The original tokens: every sentinel of `inputs` replaced by the span after it in `targets`."""
    is_sentinel = lambda t: first_sentinel - 100 < t <= first_sentinel  # noqa: E731
    assert inputs[-1] == 1 and targets[-1] == 1, "both end with EOS"
    inputs, targets = inputs[:-1].tolist(), targets[:-1].tolist()
    spans, sentinel_at = {}, [i for i, t in enumerate(targets) if is_sentinel(t)]
    for start, end in zip(sentinel_at, sentinel_at[1:] + [len(targets)]):
        spans[targets[start]] = targets[start + 1:end]
    out = []
    for token in inputs:
        out.extend(spans.pop(token) if is_sentinel(token) else [token])
    assert not any(spans.values()), "every sentinel of the targets with a span appears in the inputs"
    return out


def test_random_spans_helper_gives_t5s_published_lengths():
    assert objectives.random_spans_helper(512, 0.15, 3.0) == (568, 114)
    inputs, targets = objectives.corrupted_lengths([568, 569], 0.15, 3.0)
    assert (inputs.tolist(), targets.tolist()) == ([512, 513], [114, 114])  # 568 is the longest that fits
    assert objectives.random_spans_helper(64, 0.15, 3.0) == (70, 14)
    assert [n.tolist() for n in objectives.corrupted_lengths([70], 0.15, 3.0)] == [[64], [14]]
    # T5's helper rounds 190 * 0.15 in float64 (28.4999..: 28 noise tokens), its masks in float32 (28.500001:
    # 29): the targets then need 40 tokens, not the helper's 38. The sources check what the masks give.
    assert objectives.random_spans_helper(172, 0.15, 3.0) == (190, 38)
    assert [n.tolist() for n in objectives.corrupted_lengths([190], 0.15, 3.0)] == [[172], [40]]
    assert objectives.corrupted_lengths([1, 2, 3], 0.15, 3.0)[0].tolist() == [2, 3, 4]


def test_noise_mask_matches_t5s_counts_and_statistics():
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 569, 3000)
    noise = spans = total = 0
    span_lengths = []
    for n in lengths:
        mask = objectives.noise_mask(int(n), 0.15, 3.0, rng)
        expected_noise, expected_spans = objectives.span_counts(n, 0.15, 3.0)
        starts = np.flatnonzero(mask & ~np.concatenate([[False], mask[:-1]]))
        assert mask.sum() == expected_noise and len(starts) == expected_spans
        assert not mask[0] and mask[-1], "T5: a non-noise span first, a noise span last"
        ends = np.flatnonzero(mask & ~np.concatenate([mask[1:], [False]]))
        span_lengths += (ends - starts + 1).tolist()
        noise, spans, total = noise + mask.sum(), spans + len(starts), total + n
    assert noise / total == pytest.approx(0.15, abs=0.002)
    assert noise / spans == pytest.approx(3.0, abs=0.05)
    assert np.mean(span_lengths) == pytest.approx(3.0, abs=0.05)
    assert 1 in span_lengths and max(span_lengths) >= 10, "span lengths vary (a random segmentation)"


@pytest.mark.parametrize("packing", [False, True])
def test_span_corruption_reconstructs_the_documents_exactly(corpus, packing):
    prefix, documents = corpus
    train = documents[:int(round(300 * 949 / 1000))]
    src = span_source(prefix, packing=packing, batch_size=16)
    assert (src.vocab_size, src.eod_id) == (VOCAB + 100, 1)
    stream = np.concatenate(train)
    if packing:  # examples are document pieces of at most 70 tokens
        expected = {tuple(d[i:i + 70]) for d in train for i in range(0, len(d), 70)}
    else:  # examples are 70-token windows of the concatenated documents
        expected = {tuple(stream[i:i + 70].tolist()) for i in range(0, len(stream) - 69, 70)}
    seen = set()
    for batch in take(src, 6):
        for row in range(16):
            for inputs, targets in zip(segments_of(batch, row, "encoder"), segments_of(batch, row, "decoder")):
                original = reconstruct(inputs, targets)
                assert tuple(original) in expected
                seen.add(tuple(original))
                sentinels = inputs[inputs >= VOCAB]
                np.testing.assert_array_equal(sentinels, SENTINEL_0 - np.arange(len(sentinels)))
                if len(original) > 1:  # T5's counts; a 1-token example stays whole, with <extra_id_0> as target
                    np.testing.assert_array_equal(targets[targets >= VOCAB], sentinels)
                    noise, num_spans = objectives.span_counts(len(original), 0.15, 3.0)
                    assert (len(targets) - 1 - len(sentinels), len(sentinels)) == (noise, num_spans)
    assert len(seen) > 40
    if not packing:  # every window fills its row exactly: 64 inputs and 16 targets
        assert (batch["encoder_input_tokens"] != 0).all() and (batch["decoder_target_tokens"] != 0).all()


def test_packed_rows_have_consistent_segments_positions_and_shifted_decoder_inputs(corpus):
    prefix, _ = corpus
    batch = next(span_source(prefix, packing=True, batch_size=32))
    assert set(batch) == {"encoder_input_tokens", "decoder_target_tokens", "decoder_input_tokens",
                          "decoder_loss_weights", "encoder_segment_ids", "encoder_positions",
                          "decoder_segment_ids", "decoder_positions"}
    assert batch["encoder_input_tokens"].shape == (32, 64) and batch["decoder_target_tokens"].shape == (32, 14)
    assert (batch["encoder_segment_ids"].max(axis=1) > 1).any(), "several examples share a row"
    for side, tokens in (("encoder", batch["encoder_input_tokens"]), ("decoder", batch["decoder_target_tokens"])):
        segments, positions = batch[f"{side}_segment_ids"], batch[f"{side}_positions"]
        for row in range(32):
            used = segments[row] > 0
            assert used[:used.sum()].all(), "padding only at the end"
            assert (np.diff(segments[row][used]) >= 0).all() and segments[row][0] == 1
            starts = np.flatnonzero(np.diff(np.concatenate([[0], segments[row]])) != 0)
            for start, end in zip(starts, list(starts[1:]) + [used.sum()]):
                np.testing.assert_array_equal(positions[row, start:end], np.arange(end - start))
            assert (positions[row][~used] == 0).all() and (tokens[row][~used] == 0).all()
            assert (tokens[row][used] != 0).all()
        assert (batch["encoder_segment_ids"].max(axis=1) == batch["decoder_segment_ids"].max(axis=1)).all()
    targets, segments = batch["decoder_target_tokens"], batch["decoder_segment_ids"]
    previous_same = np.concatenate([np.zeros((32, 1), bool), segments[:, 1:] == segments[:, :-1]], axis=1)
    shifted = np.where(previous_same, np.concatenate([np.zeros((32, 1), np.int32), targets[:, :-1]], axis=1), 0)
    np.testing.assert_array_equal(batch["decoder_input_tokens"], np.where(segments > 0, shifted, 0))
    np.testing.assert_array_equal(batch["decoder_loss_weights"], (segments > 0).astype(np.float32))


@pytest.mark.parametrize("packing", [False, True])
def test_span_corruption_resumes_exactly_and_draws_new_masks_each_epoch(corpus, packing):
    prefix, _ = corpus
    uninterrupted = take(span_source(prefix, packing=packing), 10)
    first = span_source(prefix, packing=packing)
    take(first, 4)
    resumed = span_source(prefix, packing=packing)
    resumed.set_state(json.loads(json.dumps(first.get_state())))
    assert_same_batches(take(resumed, 6), uninterrupted[4:])
    train = span_source(prefix, data_split="1,0,0", batch_size=1, packing=packing)
    num_rows = len(split_rows(prefix, "train", "1,0,0", packing))
    epochs = [{tuple(next(train)["encoder_input_tokens"][0]) for _ in range(num_rows)} for _ in range(2)]
    assert len(epochs[0] & epochs[1]) < 0.5 * num_rows, "the same examples with new masks in epoch 1"
    validation = span_source(prefix, "validation", data_split="1,1,0", batch_size=1, packing=packing)
    assert validation.num_batches == len(split_rows(prefix, "validation", "1,1,0", packing))
    passes = []
    for _ in range(2):  # every evaluation: the same examples, the same masks
        validation.reset()
        passes.append(take(validation, validation.num_batches))
    assert_same_batches(*passes)


def split_rows(prefix, split, data_split, packing):
    return objectives._span_examples(objectives.open_token_file(prefix), split, data_split, 70, SMALL, packing,
                                     (0.15, 3.0))


def test_two_hosts_read_the_halves_of_the_global_batch(corpus, tmp_path, tokenizer_path):
    prefix, _ = corpus
    other = str(tmp_path / "other")
    with TokenFileWriter(other, np.uint16, {"tokenizer": made_with(tokenizer_path)}) as writer:
        writer.write(np.full(3000, 7), np.full(30, 100))
    kwargs = dict(packing=True, blend_weights=[0.5, 0.5])
    single = take(span_source([prefix, other], batch_size=8, **kwargs), 4)
    hosts = [take(span_source([prefix, other], batch_size=4, shard_index=h, shard_count=2, **kwargs), 4)
             for h in range(2)]
    for step, whole in enumerate(single):
        assert_same_batches([{k: np.concatenate([hosts[0][step][k], hosts[1][step][k]]) for k in whole}], [whole])
    encoder = np.concatenate([b["encoder_input_tokens"] for b in single])
    assert ((encoder == 7).sum(axis=1) > 30).any() and ((encoder > 7) & (encoder < VOCAB)).any(), "both files"


def test_t5_lengths_and_sentinels_with_t5s_spiece_model(tmp_path, shared_data):
    spiece = str(shared_data / "t5-spiece" / "spiece.model")
    tokenizer = load_tokenizer(spiece)
    assert objectives.vocabulary_with_sentinels(tokenizer) == (32100, 100)  # <extra_id_0> = 32099
    assert tokenizer.token_to_id("<extra_id_0>") is None and tokenizer.token_to_id("</s>") == 1
    # what model_config.vocab_from_tokenizer sizes the model to: the batches' ids, sentinels included
    assert tokenizer_vocab_size(tokenizer=spiece, objective="span_corruption") == 32100
    assert tokenizer_vocab_size(tokenizer=spiece) == 32000
    text = open(shared_data / "t5-spiece" / "SOURCE.txt").read()
    document = np.array(tokenizer.encode(text) * 40)
    prefix = tmp_path / "t5"
    with TokenFileWriter(prefix, np.uint16, {"tokenizer": {"path": spiece, "sha256": tokenizer.sha256,
                                                           "vocab_size": 32000, "eod_id": 1}}) as writer:
        writer.write(np.tile(document, 4), np.full(4, len(document)))
    stream = np.tile(document, 4)
    src = span_source(str(prefix), data_split="1,0,0", batch_size=2, feature_lengths={"inputs": 512, "targets": 114})
    assert (src.vocab_size, src.eod_id, src.tokenizer_path) == (32100, 1, spiece)
    batch = next(src)
    for row in range(2):
        inputs, targets = batch["encoder_input_tokens"][row], batch["decoder_target_tokens"][row]
        assert (len(inputs), len(targets)) == (512, 114) and (inputs != 0).all() and (targets != 0).all()
        assert inputs[-1] == targets[-1] == 1
        sentinels = inputs[inputs >= 32000]
        assert len(sentinels) == 28 and targets[0] == 32099  # 85 noise tokens in 28 spans of 568
        np.testing.assert_array_equal(sentinels, 32099 - np.arange(28))
        assert len(targets) - 1 - 28 == 85
        original = reconstruct(inputs, targets, first_sentinel=32099)
        assert any(original == stream[i:i + 568].tolist() for i in range(0, len(stream) - 567, 568))


def test_sentinel_pieces_of_a_tokenizer_are_used_or_rejected(tmp_path):
    at_the_top = word_tokenizer(tmp_path / "top.json", [(f"<extra_id_{i}>", VOCAB - 1 - i) for i in range(3)])
    assert objectives.vocabulary_with_sentinels(load_tokenizer(at_the_top)) == (VOCAB, 3)
    misplaced = word_tokenizer(tmp_path / "low.json", [(f"<extra_id_{i}>", 10 + i) for i in range(3)])
    with pytest.raises(UserError, match=r"low\.json: its pieces <extra_id_0>.. have ids \[10, 11, 12\]"):
        objectives.vocabulary_with_sentinels(load_tokenizer(misplaced))


def test_span_corruption_configuration_errors(corpus):
    prefix, _ = corpus
    with pytest.raises(UserError, match=r"into 512 inputs needs 114 targets; set FEATURE_LENGTHS\['targets'\] to 114"):
        span_source(prefix, feature_lengths={"inputs": 512, "targets": 100})
    with pytest.raises(UserError, match=r"FEATURE_LENGTHS=\{'targets': 16\}: an encoder-decoder objective needs"):
        span_source(prefix, feature_lengths={"targets": 16})
    with pytest.raises(UserError, match=r"up to 114 noise spans but the vocabulary has 100 sentinels"):
        span_source(prefix, feature_lengths={"inputs": 2048, "targets": 512})


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
        inputs, targets = objectives._open_pair_files(prefix)
        assert inputs.num_documents == targets.num_documents == 2
        return
    with pytest.raises(UserError) as raised:
        objectives._open_pair_files(prefix)
    assert str(raised.value) == (f"{prefix}.{side}.json: made with EOD appended, but the loader appends EOS after "
                                 "cutting to FEATURE_LENGTHS; re-run preprocess with --noappend_eod")


@pytest.mark.parametrize("lengths", [{"inputs": 2}, {"targets": 8}, {"inputs": 8, "targets": 8}])
def test_encoder_only_feature_lengths_are_checked_naming_the_fix(lengths):
    with pytest.raises(UserError) as raised:
        objectives.make_mlm_source("train", batch_size=4, feature_lengths=lengths, seed=0, shard_index=0,
                                   shard_count=1)
    assert str(raised.value) == (f"FEATURE_LENGTHS={lengths!r}: an encoder-only objective needs {{'inputs': N}} "
                                 "with N >= 3, e.g. {'inputs': 512}")


def test_mlm_vocabulary_uses_the_tokenizers_pieces_and_needs_all_three(tmp_path):
    bert = load_tokenizer(word_tokenizer(tmp_path / "bert.json", [("[CLS]", 5), ("[SEP]", 6), ("[MASK]", 7)]))
    assert objectives.mlm_vocabulary(bert) == objectives.MLMVocabulary(
        VOCAB, 5, 6, 7, 0, VOCAB, tuple(sorted({0, 5, 6, 7, bert.eod_id})))
    partial = load_tokenizer(word_tokenizer(tmp_path / "partial.json", [("[CLS]", 5), ("[SEP]", 6)]))
    with pytest.raises(UserError, match=r"partial\.json: has \[CLS\], \[SEP\] but not \[MASK\]; masked-LM training "
                                        r"needs all of \[CLS\], \[SEP\], \[MASK\]"):
        objectives.mlm_vocabulary(partial)


def test_mlm_sources_are_blended_by_their_weights(tmp_path, write_token_file):
    """Two token files (ids 100..299 and 600..799): blend_weights [1, 1e-6] draws the masked-LM rows from the
    first, no weights from both (a weight of 0 passes loader.combine's check, but grain's mix refuses it)."""
    path = word_tokenizer(tmp_path / "bert.json", [("[CLS]", 5), ("[SEP]", 6), ("[MASK]", 7)])
    rng = np.random.default_rng(0)
    files = [write_token_file(tmp_path / name, [list(rng.integers(low, low + 200, 30)) for _ in range(20)],
                              tokenizer=made_with(path)) for name, low in (("a", 100), ("b", 600))]

    def words(weights):
        src = objectives.make_mlm_source("train", batch_size=4, feature_lengths={"inputs": 16}, seed=0,
                                         shard_index=0, shard_count=1, data_path=files, blend_weights=weights)
        batches = take(src, 3)
        targets = np.concatenate([b["encoder_target_tokens"][b["encoder_segment_ids"] > 0] for b in batches])
        return targets[targets >= 100]

    first = words([1.0, 1e-6])
    assert len(first) and (first < 300).all()
    both = words(None)
    assert (both < 300).any() and (both >= 600).any()


def test_default_labels():
    def examples(*labels):
        return [objectives.LabelledText(text="w3", text_pair=None, label=label) for label in labels]

    assert objectives.default_labels(examples("True", "True")) == ["False", "True"]
    assert objectives.default_labels(examples("2", "0", "2")) == ["0", "1", "2"]
    assert objectives.default_labels(examples("neutral", "entailment", "neutral")) == ["entailment", "neutral"]
