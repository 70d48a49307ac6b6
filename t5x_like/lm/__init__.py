"""The LanguageModel: what the trainer, eval, generate, compile and the benchmarks see of a model.

A LanguageModel wraps a family module (models/) and knows its batch: the feature names (seqio's,
defined once here), how a batch feeds the module, the loss sums, per-token scores, KV-cache decoding
(greedy, sampling and beam search: beam_search.py), FLOPs and parameter counts. Three kinds exist, picked
by the family registry's `kind`:

    DecoderOnlyLM     GPT-2, GPT-NeoX: decoder_* features; FEATURE_LENGTHS {'targets': T}
    EncoderDecoderLM  T5 (its own issue): adds encoder_* features; {'inputs': I, 'targets': T}
    EncoderOnlyLM     BERT, RoBERTa: encoder_* features, masked-LM targets or classification labels;
                      {'inputs': I}

Decoder-only family modules are called as `module(tokens, *, positions, segment_ids, deterministic,
return_hidden)` and return fp32 logits over the padded vocabulary (padding ids masked), or with
return_hidden=True (final hidden states, the output table [padded_vocab, embed]) — tied or untied —
so that the chunked cross-entropy never materialises the logits.
"""
from __future__ import annotations

from typing import Callable

import models
from t5x_like.errors import UserError
from t5x_like.lm.base import (CROSS_ENTROPY, Batch, LanguageModel, Lengths, LossSums, check_cross_entropy,
                              cross_entropy_sums, variables)
from t5x_like.lm.decoder_only import DecoderOnlyLM
from t5x_like.lm.encoder_decoder import EncoderDecoderLM
from t5x_like.lm.encoder_only import EncoderOnlyLM

__all__ = ["CROSS_ENTROPY", "Batch", "DecoderOnlyLM", "EncoderDecoderLM", "EncoderOnlyLM", "LANGUAGE_MODELS",
           "LanguageModel", "Lengths", "LossSums", "check_cross_entropy", "check_objective", "cross_entropy_sums", "make_lm",
           "variables"]


LANGUAGE_MODELS: dict[str, type[LanguageModel]] = {cls.KIND: cls for cls in (DecoderOnlyLM, EncoderDecoderLM,
                                                                           EncoderOnlyLM)}


def check_objective(config: models.FamilyConfig, objective: str) -> None:
    """A UserError naming OBJECTIVE and the fix when the model cannot train on its batches."""
    kind = models.family_of(config).kind
    trains = LANGUAGE_MODELS[kind].objectives(config)
    if objective not in trains:
        raise UserError(f"OBJECTIVE={objective!r} cannot train the {config.family} model ({kind.replace('_', '-')}); "
                        f"it trains with OBJECTIVE={' or '.join(map(repr, trains))}: set that, or choose a model "
                        "preset of another kind.")


def make_lm(config: models.FamilyConfig, layer_stack: Callable | None = None) -> LanguageModel:
    """The LanguageModel of a family config (its registry kind), the layer stack optionally replaced
    (pipeline parallelism)."""
    kind = models.family_of(config).kind
    if kind not in LANGUAGE_MODELS:
        raise ValueError(f"model family {config.family!r} is {kind}, which this runtime does not train yet.")
    module = models.build_model(config)
    if layer_stack is not None:
        module = module.clone(layer_stack=layer_stack)
    return LANGUAGE_MODELS[kind](config, module)
