"""mlm: encoder-only lengths, the masked-LM vocabulary, blends."""

import numpy as np
import pytest

from t5x_like.data.objectives import mlm
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.errors import UserError
from tests.t5x_like.data.objectives.helpers import VOCAB, made_with, request, take, word_tokenizer


@pytest.mark.parametrize("lengths", [{"inputs": 2}, {"targets": 8}, {"inputs": 8, "targets": 8}])
def test_encoder_only_feature_lengths_are_checked_naming_the_fix(lengths):
    with pytest.raises(UserError) as raised:
        mlm.make_source(request(batch_size=4, feature_lengths=lengths))
    assert str(raised.value) == (f"FEATURE_LENGTHS={lengths!r}: an encoder-only objective needs {{'inputs': N}} "
                                 "with N >= 3, e.g. {'inputs': 512}")


def test_mlm_vocabulary_uses_the_tokenizers_pieces_and_needs_all_three(tmp_path):
    bert = load_tokenizer(word_tokenizer(tmp_path / "bert.json", [("[CLS]", 5), ("[SEP]", 6), ("[MASK]", 7)]))
    assert mlm.mlm_vocabulary(bert) == mlm.MLMVocabulary(
        VOCAB, 5, 6, 7, 0, VOCAB, tuple(sorted({0, 5, 6, 7, bert.eod_id})))
    partial = load_tokenizer(word_tokenizer(tmp_path / "partial.json", [("[CLS]", 5), ("[SEP]", 6)]))
    with pytest.raises(UserError, match=r"partial\.json: has \[CLS\], \[SEP\] but not \[MASK\]; masked-LM training "
                                        r"needs all of \[CLS\], \[SEP\], \[MASK\]"):
        mlm.mlm_vocabulary(partial)


def test_mlm_sources_are_blended_by_their_weights(tmp_path, write_token_file):
    """Two token files (ids 100..299 and 600..799): blend_weights [1, 1e-6] draws the masked-LM rows from the
    first, no weights from both (a weight of 0 passes loader.combine's check, but grain's mix refuses it)."""
    path = word_tokenizer(tmp_path / "bert.json", [("[CLS]", 5), ("[SEP]", 6), ("[MASK]", 7)])
    rng = np.random.default_rng(0)
    files = [write_token_file(tmp_path / name, [list(rng.integers(low, low + 200, 30)) for _ in range(20)],
                              tokenizer=made_with(path)) for name, low in (("a", 100), ("b", 600))]

    def words(weights):
        src = mlm.make_source(request(batch_size=4, feature_lengths={"inputs": 16}, data_path=files,
                                      blend_weights=weights))
        batches = take(src, 3)
        targets = np.concatenate([b["encoder_target_tokens"][b["encoder_segment_ids"] > 0] for b in batches])
        return targets[targets >= 100]

    first = words([1.0, 1e-6])
    assert len(first) and (first < 300).all()
    both = words(None)
    assert (both < 300).any() and (both >= 600).any()


