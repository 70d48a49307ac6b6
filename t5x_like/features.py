"""Batch feature names (seqio's), defined once for the loader, the LanguageModel and the tools.

Decoder-only batches: decoder_input_tokens, decoder_target_tokens, decoder_loss_weights, and when
packed decoder_segment_ids (documents 1, 2, ...; 0 = padding) and decoder_positions (restart at 0 per
document). Encoder-decoder batches add encoder_input_tokens (+ encoder_segment_ids, encoder_positions).
Encoder-only batches (BERT) hold encoder_input_tokens, encoder_segment_ids (1 = real, 0 = padding; the
documents 1, 2, ... when packed, with encoder_positions) and encoder_token_types (0 = first segment,
1 = the pair's second), plus for masked-LM training encoder_target_tokens (the original ids) and
encoder_loss_weights (1 at the masked positions), or for classification classification_labels [batch, 1].
Lengths come from FEATURE_LENGTHS: {'targets': T}, {'inputs': I, 'targets': T} or {'inputs': I}.
"""
DECODER_INPUT_TOKENS = "decoder_input_tokens"
DECODER_TARGET_TOKENS = "decoder_target_tokens"
DECODER_LOSS_WEIGHTS = "decoder_loss_weights"
DECODER_SEGMENT_IDS = "decoder_segment_ids"
DECODER_POSITIONS = "decoder_positions"
ENCODER_INPUT_TOKENS = "encoder_input_tokens"
ENCODER_SEGMENT_IDS = "encoder_segment_ids"
ENCODER_POSITIONS = "encoder_positions"
ENCODER_TOKEN_TYPES = "encoder_token_types"
ENCODER_TARGET_TOKENS = "encoder_target_tokens"
ENCODER_LOSS_WEIGHTS = "encoder_loss_weights"
CLASSIFICATION_LABELS = "classification_labels"

LOSS_WEIGHTS = (DECODER_LOSS_WEIGHTS, ENCODER_LOSS_WEIGHTS)
NO_LABEL = -1
"""classification_labels of a row that counts nothing (the padding rows that fill a validation pass's last batch)."""

DECODER_START_ID = 0
"""An encoder-decoder's first decoder input: the targets are shifted right with it (seqio, T5)."""


def decoder_only_length(feature_lengths: dict[str, int]) -> int:
    """The row length of a decoder-only objective: FEATURE_LENGTHS must be {'targets': T}."""
    if set(feature_lengths) != {"targets"}:
        raise ValueError(f"FEATURE_LENGTHS={dict(feature_lengths)}: a causal-LM data source takes only 'targets' "
                         "(set SEQ_LEN, or FEATURE_LENGTHS={'targets': N}).")
    return feature_lengths["targets"]
