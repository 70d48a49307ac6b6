"""Beam search (4 beams) over our T5 equals transformers' beam search on the same tiny random
T5 v1.1, token for token, with EOS reached early by some beams, for length penalties 1.0 and 0.6."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.t5 import T5
from t5x_like.lm.beam_search import beam_search, cache_batch_axes

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from tests.support.hf_models import hf_and_ours_for  # noqa: E402

BEAMS, STEPS = 4, 12


def our_beam_search(config, params, inputs, mask, *, eos_id, length_penalty):
    model = T5(config)
    inputs, mask = jnp.repeat(inputs, BEAMS, axis=0), jnp.repeat(mask, BEAMS, axis=0)
    rows = inputs.shape[0]

    def decode(cache, encoded, tokens):
        logits, variables = model.apply({"params": params, "cache": cache}, encoded, tokens, encoder_segment_ids=mask,
                                        method=T5.decode, mutable=["cache"])
        return logits[:, -1], variables["cache"]

    @jax.jit
    def search(inputs):
        encoded = model.apply({"params": params}, inputs, encoder_segment_ids=mask, method=T5.encode)
        boxed = jax.eval_shape(lambda: model.apply({"params": params}, encoded, jnp.zeros((rows, 1 + STEPS), jnp.int32),
                                                   encoder_segment_ids=mask, method=T5.decode,
                                                   mutable=["cache"])[1]["cache"])
        cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), nn.meta.unbox(boxed))
        logits, cache = decode(cache, encoded, jnp.zeros((rows, 1), jnp.int32))
        return beam_search(lambda tokens, c: decode(c, None, tokens), logits, cache, cache_batch_axes(nn.get_partition_spec(boxed)),
                           num_beams=BEAMS, max_new_tokens=STEPS, start_id=0, eos_id=eos_id, pad_id=0,
                           vocab_size=config.vocab_size, length_penalty=length_penalty)

    return search(inputs)


def after_eos_padded(sequences, eos_id):
    """transformers fills the slots after EOS with `pad_token_id or eos_token_id`, i.e. with EOS when
    the pad id is T5's 0; ours holds the pad id there."""
    after = np.cumsum(sequences[:, 1:] == eos_id, axis=1) - (sequences[:, 1:] == eos_id) > 0
    return np.concatenate([sequences[:, :1], np.where(after, 0, sequences[:, 1:])], axis=1)


@pytest.mark.parametrize("length_penalty", [1.0, 0.6])
def test_beam_search_equals_transformers(length_penalty):
    model, config, params = hf_and_ours_for("v1.1")
    inputs = np.random.default_rng(20).integers(1, 200, (3, 15))
    mask = np.ones_like(inputs)
    mask[2, 9:] = 0
    with torch.no_grad():
        greedy = model.generate(input_ids=torch.tensor(inputs), attention_mask=torch.tensor(mask),
                                max_new_tokens=STEPS, do_sample=False, num_beams=1, eos_token_id=None,
                                decoder_start_token_id=0, pad_token_id=0, use_cache=False).numpy()
    eos_id = int(greedy[0, 4])  # a token the model likes: some beams end early
    with torch.no_grad():
        theirs = model.generate(input_ids=torch.tensor(inputs), attention_mask=torch.tensor(mask),
                                max_new_tokens=STEPS, do_sample=False, num_beams=BEAMS, early_stopping=False,
                                length_penalty=length_penalty, eos_token_id=eos_id, decoder_start_token_id=0,
                                pad_token_id=0, use_cache=False, output_scores=True, return_dict_in_generate=True)
    sequences, scores = our_beam_search(config, params, jnp.asarray(inputs), jnp.asarray(mask), eos_id=eos_id,
                                        length_penalty=length_penalty)
    want = after_eos_padded(theirs.sequences.numpy(), eos_id)
    best = np.asarray(sequences[:, 0])
    assert (want == eos_id).any(axis=1).sum() >= 1
    np.testing.assert_array_equal(best[:, :want.shape[1]], want)
    assert (best[:, want.shape[1]:] == 0).all()
    np.testing.assert_allclose(np.asarray(scores[:, 0]), theirs.sequences_scores.numpy(), atol=1e-4, rtol=0)
