"""The LanguageModel: batch features, parameter counts and FLOPs from the model, one cross-entropy
for tied and chunked heads, and the messages for retired settings."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.gpt2 import GPT2Config
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
    np.testing.assert_allclose(np.array(chunked), np.array(full), rtol=1e-5)
    scores = model.score(params, batch)
    np.testing.assert_allclose(-(scores["log_prob"] * weights).sum(), float(full[0]), rtol=1e-5)


def test_the_old_cross_entropy_name_says_what_it_is_called_now():
    with pytest.raises(ValueError, match="now called 'full_logits'"):
        lm.check_cross_entropy("xla")
