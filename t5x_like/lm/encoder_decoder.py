"""The encoder-decoder LanguageModel: T5: encoder_* and decoder_* features, {'inputs': I, 'targets': T}."""
from __future__ import annotations

from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

import models
from t5x_like.errors import UserError
from t5x_like.features import (DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS, DECODER_SEGMENT_IDS,
                               DECODER_TARGET_TOKENS, ENCODER_INPUT_TOKENS, ENCODER_POSITIONS,
                               ENCODER_SEGMENT_IDS, PairEnds)
from t5x_like.lm import beam_search
from t5x_like.lm.base import Batch, LanguageModel, Lengths


class EncoderDecoderLM(LanguageModel):
    """T5-style models: the encoder reads encoder_input_tokens, the decoder decoder_input_tokens (the
    targets shifted right) and predicts decoder_target_tokens. The module is called as
    `module(encoder_input_tokens, decoder_input_tokens, *, encoder_segment_ids, decoder_segment_ids,
    encoder_positions, decoder_positions, deterministic, return_hidden)` and has `encode` / `decode`."""

    KIND = "encoder_decoder"

    @staticmethod
    def objectives(config: models.FamilyConfig) -> tuple[str, ...]:
        return ("span_corruption", "seq2seq")

    def required_lengths(self) -> tuple[str, ...]:
        return ("inputs", "targets")

    def batch_spec(self, lengths: Lengths, batch_size: int, *, packed: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
        encoder, decoder = (batch_size, lengths["inputs"]), (batch_size, lengths["targets"])
        spec = {ENCODER_INPUT_TOKENS: (encoder, jnp.int32), DECODER_INPUT_TOKENS: (decoder, jnp.int32),
                DECODER_TARGET_TOKENS: (decoder, jnp.int32), DECODER_LOSS_WEIGHTS: (decoder, jnp.float32),
                ENCODER_SEGMENT_IDS: (encoder, jnp.int32)}  # unpacked: the encoder's padding mask
        if packed:
            spec.update({ENCODER_POSITIONS: (encoder, jnp.int32), DECODER_SEGMENT_IDS: (decoder, jnp.int32),
                         DECODER_POSITIONS: (decoder, jnp.int32)})
        return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in spec.items()}

    def module_inputs(self, batch: Batch) -> tuple[tuple, dict]:
        names = (ENCODER_SEGMENT_IDS, DECODER_SEGMENT_IDS, ENCODER_POSITIONS, DECODER_POSITIONS)
        return (batch[ENCODER_INPUT_TOKENS], batch[DECODER_INPUT_TOKENS]), {k: batch[k] for k in names if k in batch}

    # -- decoding: encode the prompts once; the decoder starts from the config's decoder_start_ids (T5:
    # DECODER_START_ID; CPM-2: <s>, <s_0>) and caches its self-attention keys/values and the encoder output's
    # cross-attention keys/values
    def max_prompt_length(self, max_new_tokens: int) -> None:
        if max_new_tokens < 1:
            raise UserError(f"--max_new_tokens={max_new_tokens} must be at least 1.")
        return None

    def start_ids(self) -> tuple[int, ...]:
        """The decoder's first inputs, before the first target (T5: DECODER_START_ID; CPM-2: <s>, <s_0>)."""
        return tuple(self.config.decoder_start_ids())

    def prompt_ids(self, ids: Sequence[int], eod_id: int) -> list[int]:
        """T5's encoder reads EOS after the text, as in training (span corruption and seq2seq append it to
        every input), seqio and transformers' T5 tokenizer; CPM-2's reads the text's ids alone (CPM-2-Finetune)."""
        return [*ids, eod_id] if self.config.inputs_end_with_eos() else list(ids)

    def pair_ends(self, eod_id: int) -> PairEnds:
        """How the model's input/target pairs begin and end (seq2seq training builds its rows so)."""
        return PairEnds(self.start_ids(), eod_id if self.config.inputs_end_with_eos() else None,
                        self.config.targets_end_id(eod_id))

    def source_settings(self) -> dict[str, Any]:
        return {"pair_ends": self.pair_ends}

    def end_ids(self, eod_id: int) -> tuple[int, ...]:
        """The id that ends a target (T5: EOS; CPM-2: <s_1>, where CPM-2-Finetune's generation stops), then the
        tokenizer's end."""
        end = self.config.targets_end_id(eod_id)
        return (eod_id,) if end is eod_id else (end, eod_id)  # eod_id may be traced: no equality test

    def target_ids(self, ids: Sequence[int], eod_id: int) -> list[int]:
        """A target's ids with the id that ends it (T5: EOS; CPM-2: <s_1>)."""
        return [*ids, self.config.targets_end_id(eod_id)]

    def cache_layout(self, batch: int, prompt_length: int, max_new_tokens: int) -> tuple[Any, Any]:
        def create(params):
            inputs = jnp.zeros((batch, prompt_length), jnp.int32)
            encoded = self.module.apply({"params": params}, inputs, method="encode")
            decoder = jnp.zeros((batch, len(self.start_ids()) + max_new_tokens), jnp.int32)
            return self.module.apply({"params": params}, encoded, decoder,
                                     encoder_segment_ids=inputs, method="decode", mutable=["cache"])[1]["cache"]

        boxed = jax.eval_shape(create, self.abstract_params()[0])
        return nn.meta.unbox(boxed), nn.get_partition_spec(boxed)

    def seen_before(self, tokens: jax.Array, valid: jax.Array, vocab: int) -> jax.Array:
        """The decoder's text so far is its start ids alone (the prompt is the encoder's: transformers' repetition
        penalty reads the decoder's ids too)."""
        return jnp.zeros((tokens.shape[0], vocab), bool).at[:, jnp.asarray(self.start_ids())].set(True)

    def prefill(self, params: Any, tokens: jax.Array, valid: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """The prompts are the encoder's input; the state is (cache, the encoder's padding mask)."""
        mask = valid.astype(jnp.int32)
        positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
        encoded = self.module.apply({"params": params}, tokens, encoder_segment_ids=mask,
                                    encoder_positions=positions, method="encode")
        start = jnp.broadcast_to(jnp.asarray(self.start_ids(), jnp.int32), (tokens.shape[0], len(self.start_ids())))
        return self._decode(params, cache, encoded, start, mask)

    def step(self, params: Any, tokens: jax.Array, state: Any) -> tuple[jax.Array, Any]:
        cache, mask = state
        return self._decode(params, cache, None, tokens, mask)

    def state_batch_axes(self, cache_specs: Any) -> Any:
        return beam_search.cache_batch_axes(cache_specs), 0

    def _decode(self, params, cache, encoded, tokens, mask) -> tuple[jax.Array, Any]:
        logits, variables = self.module.apply({"params": params, "cache": cache}, encoded, tokens,
                                              encoder_segment_ids=mask, method="decode", mutable=["cache"])
        return logits[:, -1], (variables["cache"], mask)
