"""span_corruption: T5's lengths, noise statistics, sentinels, exact reconstruction, packing, resume, hosts."""
import json

import numpy as np
import pytest

from t5x_like.data import tokenizer_vocab_size
from t5x_like.data.objectives import encoder_decoder, span_corruption
from t5x_like.data.token_file import TokenFileWriter, open_token_file
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.errors import UserError
from tests.t5x_like.data.objectives.helpers import (SENTINEL_0, SMALL, VOCAB, assert_same_batches, made_with,
                                                    reconstruct, segments_of, span_source, take, word_tokenizer)


def test_random_spans_helper_gives_t5s_published_lengths():
    assert span_corruption.random_spans_helper(512, 0.15, 3.0) == (568, 114)
    inputs, targets = span_corruption.corrupted_lengths([568, 569], 0.15, 3.0)
    assert (inputs.tolist(), targets.tolist()) == ([512, 513], [114, 114])  # 568 is the longest that fits
    assert span_corruption.random_spans_helper(64, 0.15, 3.0) == (70, 14)
    assert [n.tolist() for n in span_corruption.corrupted_lengths([70], 0.15, 3.0)] == [[64], [14]]
    # T5's helper rounds 190 * 0.15 in float64 (28.4999..: 28 noise tokens), its masks in float32 (28.500001:
    # 29): the targets then need 40 tokens, not the helper's 38. The sources check what the masks give.
    assert span_corruption.random_spans_helper(172, 0.15, 3.0) == (190, 38)
    assert [n.tolist() for n in span_corruption.corrupted_lengths([190], 0.15, 3.0)] == [[172], [40]]
    assert span_corruption.corrupted_lengths([1, 2, 3], 0.15, 3.0)[0].tolist() == [2, 3, 4]


def test_noise_mask_matches_t5s_counts_and_statistics():
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 569, 3000)
    noise = spans = total = 0
    span_lengths = []
    for n in lengths:
        mask = span_corruption.noise_mask(int(n), 0.15, 3.0, rng)
        expected_noise, expected_spans = span_corruption.span_counts(n, 0.15, 3.0)
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
                    noise, num_spans = span_corruption.span_counts(len(original), 0.15, 3.0)
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
    return span_corruption._span_examples(open_token_file(prefix), split, data_split, 70, SMALL, packing,
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
    assert encoder_decoder.vocabulary_with_sentinels(tokenizer) == (32100, 100)  # <extra_id_0> = 32099
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
    assert encoder_decoder.vocabulary_with_sentinels(load_tokenizer(at_the_top)) == (VOCAB, 3)
    misplaced = word_tokenizer(tmp_path / "low.json", [(f"<extra_id_{i}>", 10 + i) for i in range(3)])
    with pytest.raises(UserError, match=r"low\.json: its pieces <extra_id_0>.. have ids \[10, 11, 12\]"):
        encoder_decoder.vocabulary_with_sentinels(load_tokenizer(misplaced))


def test_span_corruption_configuration_errors(corpus):
    prefix, _ = corpus
    with pytest.raises(UserError, match=r"into 512 inputs needs 114 targets; set FEATURE_LENGTHS\['targets'\] to 114"):
        span_source(prefix, feature_lengths={"inputs": 512, "targets": 100})
    with pytest.raises(UserError, match=r"FEATURE_LENGTHS=\{'targets': 16\}: an encoder-decoder objective needs"):
        span_source(prefix, feature_lengths={"targets": 16})
    with pytest.raises(UserError, match=r"up to 114 noise spans but the vocabulary has 100 sentinels"):
        span_source(prefix, feature_lengths={"inputs": 2048, "targets": 512})


