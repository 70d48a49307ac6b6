"""features.py: the feature names are seqio's, and decoder_only_length accepts only {'targets': T}."""
import pytest

from t5x_like import features


def test_feature_names_are_seqios():
    assert (features.DECODER_INPUT_TOKENS, features.DECODER_TARGET_TOKENS, features.DECODER_LOSS_WEIGHTS) == (
        "decoder_input_tokens", "decoder_target_tokens", "decoder_loss_weights")
    assert features.ENCODER_INPUT_TOKENS == "encoder_input_tokens"
    assert features.DECODER_START_ID == 0


def test_decoder_only_length_returns_the_targets_length():
    assert features.decoder_only_length({"targets": 17}) == 17


@pytest.mark.parametrize("lengths", [{"inputs": 8, "targets": 4}, {"inputs": 8}, {}])
def test_decoder_only_length_rejects_other_feature_lengths_naming_the_fix(lengths):
    with pytest.raises(ValueError) as raised:
        features.decoder_only_length(lengths)
    assert str(raised.value) == (f"FEATURE_LENGTHS={lengths}: a causal-LM data source takes only 'targets' "
                                 "(set SEQ_LEN, or FEATURE_LENGTHS={'targets': N}).")
