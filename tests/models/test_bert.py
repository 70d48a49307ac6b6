"""BERT / RoBERTa: the presets have transformers' parameter counts, padding ids take no probability,
packed rows compute each document as if alone, RoBERTa's positions are transformers', scanned and
unrolled blocks agree, and the encoder-only LanguageModel's batch, loss and FLOPs."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs
import models
from models.bert import BERT, BertConfig, RobertaConfig, default_positions
from t5x_like.features import (CLASSIFICATION_LABELS, ENCODER_INPUT_TOKENS, ENCODER_LOSS_WEIGHTS,
                               ENCODER_POSITIONS, ENCODER_SEGMENT_IDS, ENCODER_TARGET_TOKENS, ENCODER_TOKEN_TYPES)
from t5x_like.lm import EncoderOnlyLM, make_lm

SMALL = BertConfig(vocab_size=300, max_len=32, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                   dropout_rate=0.0, attention_dropout_rate=0.0, init_std=0.2)


def init(config, length=16):
    params = jax.jit(BERT(config).init)(jax.random.PRNGKey(0), jnp.zeros((1, length), jnp.int32))["params"]
    return nn.meta.unbox(params)


@functools.cache
def jitted_apply(config):
    return jax.jit(lambda p, t, kw: BERT(config).apply({"params": p}, t, **kw))


def apply(config, params, tokens, **kwargs):
    return np.asarray(jitted_apply(config)(params, tokens, kwargs))


def preset(name, **overrides):
    return models.config_from_dict({**configs.get_model_config(name).to_dict(), **overrides})


@pytest.mark.parametrize("name", configs.bert.PRESETS)
@pytest.mark.parametrize("head", ["mlm", "classification"])
def test_parameter_counts_equal_transformers(name, head):
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (transformers)")
    torch = pytest.importorskip("torch", reason="needs the torch extra (torch)")
    c = preset(name, head=head, num_labels=2)
    hf_config = (transformers.RobertaConfig if c.family == "roberta" else transformers.BertConfig)(
        vocab_size=c.vocab_size, hidden_size=c.embed_dim, num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads, intermediate_size=c.mlp_dim, max_position_embeddings=c.max_len,
        type_vocab_size=c.type_vocab_size, num_labels=2)
    task = "ForMaskedLM" if head == "mlm" else "ForSequenceClassification"
    with torch.device("meta"):
        hf = getattr(transformers, ("Roberta" if c.family == "roberta" else "Bert") + task)(hf_config)
    assert make_lm(c).num_params() == hf.num_parameters()


def test_published_shapes():
    assert make_lm(preset("bert_base")).num_params() == 109_514_298  # bert-base-uncased, BertForMaskedLM
    assert preset("bert_large_cased").vocab_size == 28996
    assert preset("bert_base_chinese").vocab_size == 21128
    roberta = preset("roberta_large")
    assert (roberta.family, roberta.vocab_size, roberta.max_input_length(), roberta.layer_norm_eps) == (
        "roberta", 50265, 512, 1e-5)


def test_padded_vocabulary_takes_no_probability_mass():
    params = init(SMALL)
    logits = apply(SMALL, params, jnp.arange(16)[None] * 7 % 300)
    assert logits.shape[-1] == SMALL.padded_vocab_size == 384
    probs = jax.nn.softmax(logits, axis=-1)
    assert float(probs[..., 300:].max()) == 0.0


def test_packed_documents_compute_as_if_alone():
    """A row packing two documents (segments 1, 2, then padding) with positions restarting at 0 gives
    each document the logits it has alone in a row."""
    roberta = RobertaConfig(**{f.name: getattr(SMALL, f.name) for f in dataclasses.fields(SMALL)
                               if f.name not in ("family", "position_offset", "pad_token_id", "type_vocab_size")})
    for config in (SMALL, roberta):
        params = init(config)
        rng = np.random.default_rng(0)
        a, b = rng.integers(3, 300, 7), rng.integers(3, 300, 5)
        tokens = np.zeros((1, 16), np.int32)
        tokens[0, :12] = np.concatenate([a, b])
        segments = np.array([[1] * 7 + [2] * 5 + [0] * 4], np.int32)
        positions = np.array([list(range(7)) + list(range(5)) + [0] * 4], np.int32)
        packed = apply(config, params, tokens, segment_ids=segments, positions=positions)
        alone_a = apply(config, params, a[None])
        alone_b = apply(config, params, b[None])
        np.testing.assert_allclose(packed[0, :7], alone_a[0], atol=1e-4)
        np.testing.assert_allclose(packed[0, 7:12], alone_b[0], atol=1e-4)


def test_roberta_positions_are_transformers():
    pytest.importorskip("transformers", reason="needs the torch extra (transformers)")
    torch = pytest.importorskip("torch", reason="needs the torch extra (torch)")
    from transformers.models.roberta import modeling_roberta

    tokens = np.array([[0, 5, 6, 7, 2, 1, 1], [0, 9, 2, 1, 1, 1, 1]])
    config = RobertaConfig(vocab_size=50, max_len=16, num_layers=1, num_heads=2, embed_dim=8, mlp_dim=8)
    theirs = modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(tokens), 1)
    np.testing.assert_array_equal(default_positions(config, jnp.asarray(tokens), None), theirs.numpy())
    np.testing.assert_array_equal(default_positions(config, jnp.asarray(tokens), jnp.asarray(tokens != 1)),
                                  theirs.numpy())


@pytest.mark.integration
def test_scanned_and_unrolled_layers_compute_the_same():
    scanned = init(SMALL)
    unrolled = {k: v for k, v in scanned.items() if k != "blocks"}
    for i in range(SMALL.num_layers):
        unrolled[f"block_{i}"] = jax.tree.map(lambda x: x[i], scanned["blocks"])
    tokens = jnp.arange(32).reshape(2, 16) * 7 % 300
    np.testing.assert_allclose(apply(SMALL, scanned, tokens),
                               apply(dataclasses.replace(SMALL, scan_layers=False), unrolled, tokens), atol=1e-5)


def mlm_batch(config, rows=2, length=16, seed=0):
    rng = np.random.default_rng(seed)
    targets = rng.integers(3, config.vocab_size, (rows, length)).astype(np.int32)
    weights = (rng.random((rows, length)) < 0.3).astype(np.float32)
    return {ENCODER_INPUT_TOKENS: np.where(weights > 0, 4, targets).astype(np.int32),
            ENCODER_SEGMENT_IDS: np.ones((rows, length), np.int32),
            ENCODER_TOKEN_TYPES: np.zeros((rows, length), np.int32),
            ENCODER_TARGET_TOKENS: targets, ENCODER_LOSS_WEIGHTS: weights}


def test_encoder_only_lm_masked_lm_loss_covers_masked_positions_only():
    lm = make_lm(SMALL)
    assert isinstance(lm, EncoderOnlyLM)
    assert set(lm.batch_spec({"inputs": 16}, 2)) == {ENCODER_INPUT_TOKENS, ENCODER_SEGMENT_IDS, ENCODER_TOKEN_TYPES,
                                                     ENCODER_TARGET_TOKENS, ENCODER_LOSS_WEIGHTS}
    assert ENCODER_POSITIONS in lm.batch_spec({"inputs": 16}, 2, packed=True)
    params = nn.meta.unbox(lm.init(jax.random.PRNGKey(0), {"inputs": 16}))
    batch = mlm_batch(SMALL)
    logits = apply(SMALL, params, batch[ENCODER_INPUT_TOKENS], segment_ids=batch[ENCODER_SEGMENT_IDS])
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -np.take_along_axis(np.asarray(log_probs), batch[ENCODER_TARGET_TOKENS][..., None], -1)[..., 0]
    expected = (nll * batch[ENCODER_LOSS_WEIGHTS]).sum()
    for cross_entropy in ("chunked", "full_logits"):
        total, _, weight, _ = jax.jit(lambda p, b: lm.loss_sums(p, b, cross_entropy=cross_entropy))(params, batch)
        assert float(weight) == batch[ENCODER_LOSS_WEIGHTS].sum()
        assert float(total) == pytest.approx(expected, rel=1e-5)
    scores = jax.jit(lm.score)(params, batch)
    np.testing.assert_allclose(-scores["log_prob"], nll, rtol=1e-5)


def test_encoder_only_lm_classification_loss_and_scores():
    config = dataclasses.replace(SMALL, head="classification", num_labels=3)
    lm = make_lm(config)
    spec = lm.batch_spec({"inputs": 16}, 4)
    assert spec[CLASSIFICATION_LABELS].shape == (4, 1) and ENCODER_TARGET_TOKENS not in spec
    params = nn.meta.unbox(lm.init(jax.random.PRNGKey(0), {"inputs": 16}))
    batch = {k: v for k, v in mlm_batch(config, rows=4).items()
             if k not in (ENCODER_TARGET_TOKENS, ENCODER_LOSS_WEIGHTS)}
    labels = np.array([0, 1, 2, 1], np.int32)
    batch[CLASSIFICATION_LABELS] = labels[:, None]
    logits = apply(config, params, batch[ENCODER_INPUT_TOKENS], segment_ids=batch[ENCODER_SEGMENT_IDS])
    assert logits.shape == (4, 3)
    log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))[np.arange(4), labels]
    total, _, weight, _ = jax.jit(lm.loss_sums)(params, batch)
    assert float(weight) == 4 and float(total) == pytest.approx(-log_probs.sum(), rel=1e-5)
    scores = jax.jit(lm.score)(params, batch)
    np.testing.assert_array_equal(scores["predictions"], logits.argmax(-1))
    np.testing.assert_array_equal(scores["correct"], logits.argmax(-1) == labels)


def test_flops_count_every_matmul_and_full_attention():
    c = preset("bert_base")
    t, e, layers = 512, 768, 12
    weights = layers * (4 * e * e + 2 * e * 3072) + e * e + 30522 * e
    assert c.train_flops_per_example({"inputs": t}) == 6 * weights * t + 12 * layers * t * t * e


@pytest.mark.parametrize("overrides, message", [
    ({"head": "ner"}, "head 'ner' is unknown"),
    ({"head": "classification", "num_labels": 1}, "at least 2 labels"),
    ({"num_heads": 5}, "not divisible by num_heads"),
    ({"head": "classification", "num_labels": 3, "labels": ["no", "yes"]}, "2 names for num_labels 3"),
])
def test_bad_configs_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(SMALL, **overrides)


def test_lengths_are_checked_against_the_positions():
    roberta = preset("roberta_base")
    roberta.check_lengths({"inputs": 512})
    with pytest.raises(ValueError, match="between 2 and the model's 512 positions"):
        roberta.check_lengths({"inputs": 514})
    with pytest.raises(ValueError, match="takes only 'inputs'"):
        roberta.check_lengths({"targets": 128})


def test_a_batch_for_the_other_head_is_refused():
    lm = make_lm(SMALL)
    params = nn.meta.unbox(lm.init(jax.random.PRNGKey(0), {"inputs": 16}))
    batch = {k: v for k, v in mlm_batch(SMALL).items() if k not in (ENCODER_TARGET_TOKENS, ENCODER_LOSS_WEIGHTS)}
    batch[CLASSIFICATION_LABELS] = np.zeros((2, 1), np.int32)
    with pytest.raises(ValueError, match="the batch has no encoder_target_tokens / encoder_loss_weights: the "
                                         "model's 'mlm' head trains with OBJECTIVE='mlm'"):
        lm.loss_sums(params, batch)


def test_pipeline_parallelism_is_refused_with_the_fix():
    with pytest.raises(ValueError, match="pipeline parallelism is not supported for encoder-only models.*"
                                         "PIPELINE_PARALLEL=1"):
        SMALL.pipeline_stacks()


def test_encoder_only_models_do_not_generate():
    with pytest.raises(ValueError, match="encoder-only model: it does not generate"):
        make_lm(SMALL).max_prompt_length(8)
