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
from __future__ import annotations

import dataclasses

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


@dataclasses.dataclass(frozen=True)
class PairEnds:
    """How an encoder-decoder's input/target pairs begin and end (its config says; LanguageModel.source_settings
    hands it to the seq2seq data): the encoder reads `inputs_end_id` after each input (None: nothing), the decoder
    reads `start_ids` first (those after the first are labels too) and `targets_end_id` closes every target."""

    start_ids: tuple[int, ...]
    inputs_end_id: int | None
    targets_end_id: int

    @classmethod
    def seqio(cls, eod_id: int) -> PairEnds:
        """seqio's (T5's): EOS after inputs and targets, the targets shifted right from DECODER_START_ID."""
        return cls((DECODER_START_ID,), eod_id, eod_id)

    @property
    def added_inputs(self) -> int:
        """Ids an input gains (its end)."""
        return int(self.inputs_end_id is not None)

    @property
    def added_targets(self) -> int:
        """Ids a target's labels gain (the start ids after the first, its end)."""
        return len(self.start_ids)

    def inputs(self, ids, length: int) -> list[int]:
        """The encoder's ids for an input's ids, cut to fit `length`."""
        end = [] if self.inputs_end_id is None else [self.inputs_end_id]
        return [*ids[:length - len(end)], *end]

    def targets(self, ids, length: int) -> list[int]:
        """The labels for a target's ids, cut to fit `length`: the start ids after the first, the ids, the end."""
        return [*self.start_ids[1:], *ids[:max(0, length - self.added_targets)], self.targets_end_id]


def decoder_only_length(feature_lengths: dict[str, int]) -> int:
    """The row length of a decoder-only objective: FEATURE_LENGTHS must be {'targets': T}."""
    if set(feature_lengths) != {"targets"}:
        raise ValueError(f"FEATURE_LENGTHS={dict(feature_lengths)}: a causal-LM data source takes only 'targets' "
                         "(set SEQ_LEN, or FEATURE_LENGTHS={'targets': N}).")
    return feature_lengths["targets"]
