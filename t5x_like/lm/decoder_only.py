"""The decoder-only LanguageModel: GPT-2, GPT-NeoX, CPM: decoder_* features, FEATURE_LENGTHS {'targets': T}."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

import models
from t5x_like.errors import UserError
from t5x_like.features import (DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS, DECODER_SEGMENT_IDS,
                               DECODER_TARGET_TOKENS)
from t5x_like.lm import beam_search
from t5x_like.lm.base import Batch, LanguageModel, Lengths


class DecoderOnlyLM(LanguageModel):
    """GPT-style models: the decoder reads decoder_input_tokens and predicts decoder_target_tokens."""

    KIND = "decoder_only"

    @staticmethod
    def objectives(config: models.FamilyConfig) -> tuple[str, ...]:
        return ("causal_lm",)

    def required_lengths(self) -> tuple[str, ...]:
        return ("targets",)

    @property
    def max_length(self) -> int:
        """The longest sequence the model takes (decoder-only configs have `max_len`)."""
        return self.config.max_len

    def max_lengths(self) -> dict[str, int]:
        return {"targets": self.max_length}

    def batch_spec(self, lengths: Lengths, batch_size: int, *, packed: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
        shape = (batch_size, lengths["targets"])
        spec = {DECODER_INPUT_TOKENS: jnp.int32, DECODER_TARGET_TOKENS: jnp.int32, DECODER_LOSS_WEIGHTS: jnp.float32}
        if packed:
            spec.update({DECODER_SEGMENT_IDS: jnp.int32, DECODER_POSITIONS: jnp.int32})
        return {k: jax.ShapeDtypeStruct(shape, dtype) for k, dtype in spec.items()}

    def module_inputs(self, batch: Batch) -> tuple[tuple, dict]:
        kwargs = {}
        if DECODER_POSITIONS in batch:
            kwargs["positions"] = batch[DECODER_POSITIONS]
        if DECODER_SEGMENT_IDS in batch:
            kwargs["segment_ids"] = batch[DECODER_SEGMENT_IDS]
        return (batch[DECODER_INPUT_TOKENS],), kwargs

    # -- KV-cache decoding: the prompt's tokens through the cache, then one token per step
    def max_prompt_length(self, max_new_tokens: int) -> int:
        if not 0 < max_new_tokens < self.max_length:
            raise UserError(f"--max_new_tokens={max_new_tokens} must be between 1 and the model's max_len - 1 "
                            f"({self.max_length - 1}).")
        return self.max_length - max_new_tokens

    def cache_layout(self, batch: int, prompt_length: int, max_new_tokens: int) -> tuple[Any, Any]:
        def create(params):
            zeros = jnp.zeros((batch, prompt_length + max_new_tokens), jnp.int32)
            return self.module.apply({"params": params}, zeros, positions=zeros, mutable=["cache"])[1]["cache"]

        boxed = jax.eval_shape(create, self.abstract_params()[0])
        return nn.meta.unbox(boxed), nn.get_partition_spec(boxed)

    def prefill(self, params: Any, tokens: jax.Array, valid: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Left-padded prompts: positions count from each row's first real token, padding is segment 0.
        The state is (cache, each row's next position)."""
        positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
        logits, cache = self._apply(params, cache, tokens, positions, valid.astype(jnp.int32))
        return logits, (cache, positions[:, -1] + 1)

    def step(self, params: Any, tokens: jax.Array, state: Any) -> tuple[jax.Array, Any]:
        cache, position = state
        logits, cache = self._apply(params, cache, tokens, position[:, None], jnp.ones_like(tokens))
        return logits, (cache, position + 1)

    def state_batch_axes(self, cache_specs: Any) -> Any:
        return beam_search.cache_batch_axes(cache_specs), 0

    def _apply(self, params, cache, tokens, positions, segment_ids) -> tuple[jax.Array, Any]:
        logits, variables = self.module.apply({"params": params, "cache": cache}, tokens, positions=positions,
                                              segment_ids=segment_ids, mutable=["cache"])
        return logits[:, -1], variables["cache"]
