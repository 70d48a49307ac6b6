"""Masked-LM data and training for encoder-only models (CPU, 8 devices): BERT's masking statistics over
100k tokens (15 % +- 0.5 selected, 80/10/10 +- 1 point), specials never selected, whole words selected
whole, masks new every epoch yet the same after a resume, and MLM training (and validation) on data x
tensor giving one device's losses (fp32, rtol 1e-5); an OBJECTIVE the model cannot train is refused."""
import dataclasses

import jax
import numpy as np
import pytest

from models.bert import BertConfig
from partitioning import make_mesh
from t5x_like import optim
from t5x_like.data import SourceSettings, load_tokenizer, make_source
from t5x_like.data.objectives.mlm import MLMVocabulary, mlm_mask, word_starts
from t5x_like.errors import UserError
from t5x_like.experiment import ExperimentSettings, build_experiment
from t5x_like.features import (ENCODER_INPUT_TOKENS, ENCODER_LOSS_WEIGHTS, ENCODER_POSITIONS, ENCODER_SEGMENT_IDS,
                               ENCODER_TARGET_TOKENS)
from t5x_like.lm import check_objective

VOCAB = MLMVocabulary(vocab_size=1003, cls_id=1000, sep_id=1001, mask_id=1002, pad_id=0, random_ids=1000,
                      special_ids=(0, 1000, 1001, 1002))
LENGTHS = {"inputs": 32}
# the builtin corpus's 8192 ids + [CLS], [SEP], [MASK]; 4 heads and a vocabulary padded to 8320 divide every mesh
CONFIG = BertConfig(vocab_size=8195, max_len=32, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                    dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")


def mask_rows(rows: int, length: int, starts_word=None, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        tokens = rng.integers(1, 1000, length)
        tokens[0], tokens[-1] = VOCAB.cls_id, VOCAB.sep_id
        maskable = ~np.isin(tokens, VOCAB.special_ids)
        starts = np.ones(maskable.sum(), bool) if starts_word is None else starts_word(tokens)[maskable]
        out.append((tokens, *mlm_mask(tokens, maskable, starts, 0.15, VOCAB, rng)))
    return out


def test_masking_statistics_over_100k_tokens():
    rows = mask_rows(200, 502)
    tokens = np.concatenate([t for t, _, _ in rows])
    inputs = np.concatenate([i for _, i, _ in rows])
    weights = np.concatenate([w for _, _, w in rows]) > 0
    maskable = ~np.isin(tokens, VOCAB.special_ids)
    assert maskable.sum() == 100_000
    assert not weights[~maskable].any()  # [CLS] / [SEP] never selected
    assert weights.sum() / maskable.sum() == pytest.approx(0.15, abs=0.005)
    selected_inputs, selected_tokens = inputs[weights], tokens[weights]
    masked = (selected_inputs == VOCAB.mask_id).mean()
    kept = (selected_inputs == selected_tokens).mean()
    randomised = ((selected_inputs != VOCAB.mask_id) & (selected_inputs != selected_tokens)).mean()
    assert masked == pytest.approx(0.8, abs=0.01)
    assert kept == pytest.approx(0.1, abs=0.01)
    assert randomised == pytest.approx(0.1, abs=0.01)
    assert (inputs[~weights] == tokens[~weights]).all()  # nothing else changes
    assert selected_inputs.max() < VOCAB.vocab_size


def test_whole_words_are_selected_whole():
    starts_word = lambda tokens: tokens % 3 == 0  # noqa: E731  (a word: a piece divisible by 3, then the rest)
    for tokens, _, weights in mask_rows(50, 64, starts_word):
        maskable = ~np.isin(tokens, VOCAB.special_ids)
        positions = np.flatnonzero(maskable)
        word = np.cumsum(starts_word(tokens)[positions] | (np.diff(positions, prepend=-2) != 1))
        for w in np.unique(word):
            chosen = weights[positions[word == w]]
            assert chosen.all() or not chosen.any()
        assert 0 < weights.sum() <= round(maskable.sum() * 0.15)


def test_word_starts_of_wordpiece_and_byte_level_bpe(tmp_path):
    from tokenizers import Tokenizer, models

    pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "play", "##ing", "walk", "##ed"]
    Tokenizer(models.WordPiece({p: i for i, p in enumerate(pieces)}, unk_token="[UNK]")).save(str(tmp_path / "t.json"))
    np.testing.assert_array_equal(word_starts(load_tokenizer(str(tmp_path / "t.json")))[5:], [1, 0, 1, 0])
    builtin = load_tokenizer(make_source("test", SourceSettings(objective="mlm"), batch_size=1, feature_lengths=LENGTHS,
                                         seed=0, shard_index=0, shard_count=1).tokenizer_path)
    starts = word_starts(builtin)
    assert starts[builtin.token_to_id("Ġthe")] and not starts[builtin.token_to_id("ing")]


def source(split="train", batch_size=4, **kwargs):
    return make_source(split, SourceSettings(objective="mlm", **kwargs), batch_size=batch_size,
                       feature_lengths=LENGTHS, seed=3, shard_index=0, shard_count=1)


def test_builtin_corpus_rows_are_cls_text_sep():
    for packing in (False, True):
        batch = next(source(packing=packing, whole_word_masking=True))
        real = batch[ENCODER_SEGMENT_IDS] > 0
        targets = batch[ENCODER_TARGET_TOKENS]
        starts = real & (np.concatenate([np.zeros((4, 1)), batch[ENCODER_SEGMENT_IDS][:, :-1]], 1)
                         != batch[ENCODER_SEGMENT_IDS])
        assert (targets[starts] == 8192).all()  # [CLS], the first id above the builtin tokenizer's
        assert (targets[real] != 0).all()  # the end-of-document id is left out
        specials = targets >= 8192
        assert not batch[ENCODER_LOSS_WEIGHTS][specials | ~real].any()
        assert (ENCODER_POSITIONS in batch) == packing


def test_masks_are_new_every_epoch_and_the_same_after_a_resume():
    train = source(batch_size=64, data_split="1,1,98")  # 1 % of the builtin corpus: under 400 rows an epoch
    first_seen, repeats = {}, 0
    for _ in range(16):
        batch = next(train)
        for inputs, targets in zip(batch[ENCODER_INPUT_TOKENS], batch[ENCODER_TARGET_TOKENS]):
            before = first_seen.setdefault(targets.tobytes(), inputs)
            if before is not inputs and (targets > 0).sum() >= 12:  # a row with words to mask
                repeats += 1
                assert (before != inputs).any()  # the same row in another epoch: its mask drawn anew
    assert repeats > 300  # over 2.5 epochs read

    passes = [[batch[ENCODER_INPUT_TOKENS] for batch in source("test")] for _ in range(2)]
    assert len(passes[0]) == 5  # the test split: 20 rows of 32, read once, in order
    np.testing.assert_array_equal(passes[0], passes[1])  # evaluation masks the same rows the same way

    train = source()
    for _ in range(3):
        next(train)
    state = train.get_state()
    want = [next(train) for _ in range(2)]
    resumed = source()
    resumed.set_state(state)
    for batch in want:
        got = next(resumed)
        for name, value in batch.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def run(mesh, rules, data, config=CONFIG):
    optimizer = optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=2)
    exp = build_experiment(ExperimentSettings(model=config, mesh=mesh, rules=rules, optimizer=optimizer, batch_size=8,
                                              feature_lengths=LENGTHS), train_steps=len(data))
    state = exp.init_state()
    losses = []
    with exp.partitioner.activate():
        for batch in data:
            state, metrics = exp.train_step(state, exp.global_batch(batch))
            losses.append(float(metrics["loss"]))
        evaluated = jax.device_get(exp.eval_step(state.params, exp.global_batch(data[0])))
    return losses, evaluated


@pytest.mark.integration
def test_mlm_training_on_data_x_tensor_equals_one_device():
    stream = make_source("train", SourceSettings(objective="mlm", packing=True), batch_size=8, feature_lengths=LENGTHS,
                         seed=3, shard_index=0, shard_count=1)
    data = [next(stream) for _ in range(6)]
    want, want_eval = run(make_mesh(data=1, devices=jax.devices()[:1]), "fsdp_tensor", data)
    assert want[-1] < want[0] - 0.1  # it learns (9.05 -> 8.90 in 6 steps)
    assert want_eval["weight_sum"] == data[0][ENCODER_LOSS_WEIGHTS].sum()  # validation counts masked tokens only
    got, got_eval = run(make_mesh(data=4, tensor=2), "fsdp_tensor", data)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for name in ("nll_sum", "accuracy_sum", "weight_sum"):
        np.testing.assert_allclose(got_eval[name], want_eval[name], rtol=1e-5, err_msg=name)


@pytest.mark.parametrize("config, objective, message", [
    (CONFIG, "causal_lm", "OBJECTIVE='causal_lm' cannot train the bert model .encoder-only.; it trains with "
                          "OBJECTIVE='mlm'"),
    (dataclasses.replace(CONFIG, head="classification"), "mlm", "it trains with OBJECTIVE='classification'"),
])
def test_an_objective_the_model_cannot_train_is_refused(config, objective, message):
    with pytest.raises(UserError, match=message):
        check_objective(config, objective)
    check_objective(config, "mlm" if config.head == "mlm" else "classification")
