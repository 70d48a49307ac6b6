"""The LanguageModel: batch features, parameter counts and FLOPs from the model, one cross-entropy
for tied and chunked heads, and the messages for retired settings."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.gpt2 import GPT2Config
from partitioning import Partitioner, make_mesh
from t5x_like import features, lm

TINY = GPT2Config(vocab_size=300, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                  dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")


def test_batch_spec_names_the_seqio_features():
    model = lm.make_lm(TINY)
    assert set(model.batch_spec({"targets": 16}, 4)) == {
        features.DECODER_INPUT_TOKENS, features.DECODER_TARGET_TOKENS, features.DECODER_LOSS_WEIGHTS}
    packed = model.batch_spec({"targets": 16}, 4, packed=True)
    assert packed[features.DECODER_SEGMENT_IDS].shape == (4, 16)
    assert packed[features.DECODER_LOSS_WEIGHTS].dtype == jnp.float32


def test_num_params_excludes_vocabulary_padding_and_equals_transformers():
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    transformers = pytest.importorskip("transformers", reason="needs the torch extra")
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=TINY.vocab_size, n_positions=TINY.max_len, n_embd=TINY.embed_dim, n_layer=TINY.num_layers,
        n_head=TINY.num_heads, n_inner=TINY.mlp_dim))
    want = sum(p.numel() for p in hf.parameters())  # the tied head is one tensor
    for multiple in (128, 1024):  # 300 ids padded to 384 or 1024 rows: the count does not move
        config = dataclasses.replace(TINY, vocab_pad_multiple=multiple)
        assert lm.make_lm(config).num_params() == want
    del torch


def test_flops_per_step_counts_every_weight_matmul_and_causal_attention():
    """An independent count for GPT-2 small at T=1024: 6 FLOPs per weight per token over the blocks'
    four matrices and the tied head, plus causal attention 6·L·T²·d."""
    small = GPT2Config()
    L, d, T, V = 12, 768, 1024, 50257
    block_weights = 3 * d * d + d * d + 2 * d * 4 * d
    want = 6 * (L * block_weights + V * d) * T + 6 * L * T * T * d
    assert lm.make_lm(small).flops_per_step({"targets": T}, batch_size=8) == 8 * want


def test_chunked_and_full_logits_losses_agree():
    model = lm.make_lm(TINY)
    params = jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x,
                          model.init(jax.random.PRNGKey(0), {"targets": 16}),
                          is_leaf=lambda x: hasattr(x, "unbox"))
    tokens = np.random.default_rng(0).integers(0, TINY.vocab_size, (2, 17)).astype(np.int32)
    weights = np.random.default_rng(1).uniform(size=(2, 16)).astype(np.float32)
    batch = {features.DECODER_INPUT_TOKENS: tokens[:, :-1], features.DECODER_TARGET_TOKENS: tokens[:, 1:],
             features.DECODER_LOSS_WEIGHTS: weights}
    chunked = model.loss_sums(params, batch, z_loss=1e-4, cross_entropy="chunked")
    full = model.loss_sums(params, batch, z_loss=1e-4, cross_entropy="full_logits")
    np.testing.assert_allclose(np.array(chunked[:3]), np.array(full[:3]), rtol=1e-5)
    assert chunked.auxiliary == full.auxiliary == {}  # a dense model reports no router losses
    scores = model.score(params, batch)
    np.testing.assert_allclose(-(scores["log_prob"] * weights).sum(), float(full[0]), rtol=1e-5)


def test_the_old_cross_entropy_name_says_what_it_is_called_now():
    with pytest.raises(ValueError, match="now called 'full_logits'"):
        lm.check_cross_entropy("xla")


def unboxed_params(model):
    return jax.tree.map(lambda x: x.unbox() if hasattr(x, "unbox") else x, model.init(jax.random.PRNGKey(0), {
        name: 8 for name in model.required_lengths()}), is_leaf=lambda x: hasattr(x, "unbox"))


def greedy(logits, rng, seen=None):
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def naive_greedy(forward, prompts, steps, eod_id):
    """Greedy decoding by recomputing every row's whole sequence each step: forward(sequences) -> the
    logits [rows, vocab] of each row's next token."""
    sequences, out = [list(p) for p in prompts], [[] for _ in prompts]
    for _ in range(steps):
        logits = forward(sequences)
        for row, generated in enumerate(out):
            token = eod_id if generated and generated[-1] == eod_id else int(np.argmax(logits[row]))
            generated.append(token)
            sequences[row].append(token)
    return np.array(out)


def right_padded(rows, width):
    """rows of ids -> ([len(rows), width] ids padded with 0 on the right, their lengths)."""
    return jnp.asarray([r + [0] * (width - len(r)) for r in rows], jnp.int32), np.array([len(r) for r in rows])


def left_padded(prompts):
    width = max(map(len, prompts))
    tokens = np.array([[0] * (width - len(p)) + p for p in prompts], np.int32)
    valid = np.array([[False] * (width - len(p)) + [True] * len(p) for p in prompts])
    return jnp.asarray(tokens), jnp.asarray(valid)


def check_decoding(model, params, forward, prompts, steps=5):
    """Greedy decode equals recomputing the sequences each step, before and after an end-of-document id
    cuts row 0 short."""
    tokens, valid = left_padded(prompts)
    free = naive_greedy(forward, prompts, steps, eod_id=-1)
    partitioner = Partitioner(make_mesh(data=1, devices=jax.devices()[:1]), "data_parallel")
    shapes, specs = model.cache_layout(len(prompts), tokens.shape[1], steps)
    layout = (shapes, partitioner.shardings(specs))
    decode = jax.jit(lambda p, t, v, eod: model.decode(p, t, v, jax.random.PRNGKey(0), max_new_tokens=steps,
                                                       eod_id=eod, sample=greedy, cache_layout=layout))
    search = jax.jit(lambda p, t, v, eod: model.beam_search(p, t, v, num_beams=1, max_new_tokens=steps, eod_id=eod,
                                                            length_penalty=1.0, cache_layout=layout))
    for eod_id in (int(free[0, 1]), 299):
        want = free if eod_id == 299 and 299 not in free else naive_greedy(forward, prompts, steps, eod_id)
        with partitioner.activate():
            np.testing.assert_array_equal(decode(params, tokens, valid, eod_id), want)
            np.testing.assert_array_equal(search(params, tokens, valid, eod_id), want)  # one beam: greedy


def test_decoder_only_decoding_equals_recomputing_the_sequence():
    model = lm.make_lm(TINY)
    params = unboxed_params(model)
    apply = jax.jit(lambda ids: model.module.apply({"params": params}, ids))

    def forward(sequences):
        ids, lengths = right_padded(sequences, 12)  # causal: the padding after a row changes none of its logits
        return np.asarray(apply(ids))[np.arange(len(lengths)), lengths - 1, :TINY.vocab_size]

    check_decoding(model, params, forward, [[5, 17, 42, 7, 99], [3, 250, 8]])
    with pytest.raises(ValueError, match=r"--max_new_tokens=16 must be between 1 and the model's max_len - 1 \(15\)"):
        model.max_prompt_length(16)
    assert model.max_prompt_length(6) == 10


def test_encoder_decoder_loss_decoding_and_scores_equal_the_full_forward():
    from models.t5 import T5Config
    config = T5Config(vocab_size=300, num_layers=2, num_decoder_layers=2, num_heads=4, embed_dim=32, d_kv=8,
                      mlp_dim=64, feed_forward="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0)
    model = lm.make_lm(config)
    assert model.required_lengths() == ("inputs", "targets") and model.prompt_ids([4, 5], 1) == [4, 5, 1]
    assert model.objectives(config) == ("span_corruption", "seq2seq")
    assert set(model.batch_spec({"inputs": 8, "targets": 4}, 2, packed=True)) == {
        features.ENCODER_INPUT_TOKENS, features.DECODER_INPUT_TOKENS, features.DECODER_TARGET_TOKENS,
        features.DECODER_LOSS_WEIGHTS, features.ENCODER_SEGMENT_IDS, features.ENCODER_POSITIONS,
        features.DECODER_SEGMENT_IDS, features.DECODER_POSITIONS}
    params = unboxed_params(model)

    prompts = [[5, 17, 42, 7, 99], [3, 250, 8]]
    inputs, input_lengths = right_padded(prompts, 5)
    mask = jnp.asarray(np.arange(5) < input_lengths[:, None], jnp.int32)
    apply = jax.jit(lambda ids: model.module.apply({"params": params}, inputs, ids, encoder_segment_ids=mask))

    def forward(sequences):  # the decoder reads the start id, then what was generated (causal, right-padded)
        generated = [[features.DECODER_START_ID] + s[len(p):] for s, p in zip(sequences, prompts)]
        ids, lengths = right_padded(generated, 6)
        return np.asarray(apply(ids))[np.arange(len(lengths)), lengths - 1, :config.vocab_size]

    check_decoding(model, params, forward, prompts)
    rng = np.random.default_rng(2)
    targets = rng.integers(1, 300, (2, 4)).astype(np.int32)
    batch = {features.ENCODER_INPUT_TOKENS: rng.integers(1, 300, (2, 8)).astype(np.int32),
             features.ENCODER_SEGMENT_IDS: np.array([[1] * 8, [1] * 5 + [0] * 3], np.int32),
             features.DECODER_INPUT_TOKENS: np.concatenate([np.zeros((2, 1), np.int32), targets[:, :-1]], 1),
             features.DECODER_TARGET_TOKENS: targets, features.DECODER_LOSS_WEIGHTS: np.array(
                 [[1, 1, 1, 1], [1, 1, 0, 0]], np.float32)}
    logits = np.asarray(model.module.apply(
        {"params": params}, batch[features.ENCODER_INPUT_TOKENS], batch[features.DECODER_INPUT_TOKENS],
        encoder_segment_ids=batch[features.ENCODER_SEGMENT_IDS]), np.float64)[..., :config.vocab_size]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    target_log_probs = np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    weights = batch[features.DECODER_LOSS_WEIGHTS]
    for cross_entropy in lm.CROSS_ENTROPY:
        nll, z, total, _ = model.loss_sums(params, batch, cross_entropy=cross_entropy)
        assert float(nll) == pytest.approx(-(target_log_probs * weights).sum(), rel=1e-5) and float(total) == 6.0
    scores = model.score(params, batch)
    np.testing.assert_allclose(scores["log_prob"], target_log_probs, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(scores["correct"], log_probs.argmax(-1) == targets)


def test_cross_entropy_sums_equal_numpy():
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
    targets = rng.integers(0, 7, (2, 3))
    weights = rng.uniform(size=(2, 3)).astype(np.float32)
    log_z = np.log(np.exp(logits.astype(np.float64)).sum(-1))
    nll = ((log_z - np.take_along_axis(logits, targets[..., None], -1)[..., 0]) * weights).sum()
    got_nll, got_z = lm.cross_entropy_sums(jnp.asarray(logits, jnp.bfloat16).astype(jnp.float32), targets, weights,
                                           z_loss=0.25)
    assert float(got_nll) == pytest.approx(nll, rel=1e-2)
    got_nll, got_z = lm.cross_entropy_sums(jnp.asarray(logits), targets, weights, z_loss=0.25)
    assert float(got_nll) == pytest.approx(nll, rel=1e-5)
    assert float(got_z) == pytest.approx(0.25 * (log_z ** 2 * weights).sum(), rel=1e-5)


def test_encoder_only_masked_lm_and_classification_losses_equal_numpy():
    from models.bert import BertConfig
    rng = np.random.default_rng(4)
    tokens = rng.integers(5, 300, (2, 8)).astype(np.int32)
    base = {features.ENCODER_INPUT_TOKENS: tokens, features.ENCODER_TOKEN_TYPES: np.zeros((2, 8), np.int32),
            features.ENCODER_SEGMENT_IDS: np.array([[1] * 8, [1] * 6 + [0] * 2], np.int32)}
    for head in ("mlm", "classification"):
        config = BertConfig(vocab_size=300, max_len=32, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                            dropout_rate=0.0, attention_dropout_rate=0.0, init_std=0.2, head=head, num_labels=3)
        model = lm.make_lm(config)
        assert model.objectives(config) == (("mlm",) if head == "mlm" else ("classification",))
        params = unboxed_params(model)
        if head == "mlm":
            targets = rng.integers(5, 300, (2, 8)).astype(np.int32)
            weights = (rng.uniform(size=(2, 8)) < 0.5).astype(np.float32)
            batch = {**base, features.ENCODER_TARGET_TOKENS: targets, features.ENCODER_LOSS_WEIGHTS: weights}
        else:
            targets, weights = np.array([[2], [0]], np.int32), np.ones(2, np.float32)
            batch = {**base, features.CLASSIFICATION_LABELS: targets}
        assert set(model.batch_spec({"inputs": 8}, 2)) == set(batch)
        args, kwargs = model.module_inputs(batch)
        logits = np.asarray(model.module.apply({"params": params}, *args, **kwargs), np.float64)
        logits = logits[..., :config.vocab_size] if head == "mlm" else logits
        log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
        labels = targets if head == "mlm" else targets[:, 0]
        target_log_probs = np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
        nll, z, total, _ = model.loss_sums(params, batch, z_loss=0.0)
        assert float(nll) == pytest.approx(-(target_log_probs * weights).sum(), rel=1e-5)
        assert float(total) == weights.sum()
        scores = model.score(params, batch)
        np.testing.assert_allclose(scores["log_prob"], target_log_probs, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(scores["correct"], log_probs.argmax(-1) == labels)
        if head == "classification":
            np.testing.assert_array_equal(scores["predictions"], log_probs.argmax(-1))
        missing = {k: v for k, v in batch.items() if k not in (features.CLASSIFICATION_LABELS,
                                                               features.ENCODER_TARGET_TOKENS)}
        with pytest.raises(ValueError, match=f"the model's '{head}' head trains with OBJECTIVE="):
            model.loss_sums(params, missing)
        with pytest.raises(ValueError, match="is an encoder-only model: it does not generate text"):
            model.max_prompt_length(4)


def test_an_objective_the_model_cannot_train_is_named():
    lm.check_objective(TINY, "causal_lm")
    with pytest.raises(ValueError) as raised:
        lm.check_objective(TINY, "span_corruption")
    assert str(raised.value) == ("OBJECTIVE='span_corruption' cannot train the gpt2 model (decoder-only); it trains "
                                 "with OBJECTIVE='causal_lm': set that, or choose a model preset of another kind.")
    with pytest.raises(ValueError, match=r"CROSS_ENTROPY='fast': choose one of \('chunked', 'full_logits'\)"):
        lm.check_cross_entropy("fast")


def test_fp8_state_dropout_and_the_layer_stack_hook_reach_the_module():
    """init_variables adds the FP8 state only for matmul_dtype='fp8'; loss_sums with a dropout key drops out
    (another loss, the same for the same key); make_lm hands a layer_stack hook to a scanned model."""
    from models.layers import FP8_STATE
    assert set(lm.make_lm(TINY).init_variables(jax.random.PRNGKey(0), {"targets": 8})) == {"params"}
    fp8 = lm.make_lm(dataclasses.replace(TINY, matmul_dtype="fp8"))
    assert set(fp8.init_variables(jax.random.PRNGKey(0), {"targets": 8})) == {"params", FP8_STATE}
    dropped = lm.make_lm(dataclasses.replace(TINY, dropout_rate=0.5))
    params = unboxed_params(dropped)
    tokens = np.random.default_rng(5).integers(0, TINY.vocab_size, (2, 9)).astype(np.int32)
    batch = {features.DECODER_INPUT_TOKENS: tokens[:, :-1], features.DECODER_TARGET_TOKENS: tokens[:, 1:],
             features.DECODER_LOSS_WEIGHTS: np.ones((2, 8), np.float32)}
    plain = float(dropped.loss_sums(params, batch)[0])
    keyed = [float(dropped.loss_sums(params, batch, jax.random.PRNGKey(k))[0]) for k in (1, 1, 2)]
    assert keyed[0] == keyed[1] and keyed[0] != plain and keyed[2] != keyed[0]
    seen = []

    def hook(block, stack):
        seen.append(block)
        return stack

    hooked = lm.make_lm(dataclasses.replace(TINY, scan_layers=True), layer_stack=hook)
    hooked.init(jax.random.PRNGKey(0), {"targets": 8})
    assert seen
