"""The encoder-only LanguageModel: BERT, RoBERTa: encoder_* features, masked-LM targets or classification labels, {'inputs': I}."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

import models
from models.layers import ROUTER_STATS
from t5x_like.errors import UserError
from t5x_like.features import (CLASSIFICATION_LABELS, ENCODER_INPUT_TOKENS, ENCODER_LOSS_WEIGHTS, ENCODER_POSITIONS,
                               ENCODER_SEGMENT_IDS, ENCODER_TARGET_TOKENS, ENCODER_TOKEN_TYPES, NO_LABEL)
from t5x_like.lm.base import Batch, LanguageModel, Lengths, LossSums, cross_entropy_sums, variables


class EncoderOnlyLM(LanguageModel):
    """BERT-style models: the encoder reads encoder_input_tokens (+ token types) and, by the config's
    `head`, predicts the masked tokens ('mlm': encoder_target_tokens where encoder_loss_weights is 1)
    or one label per row ('classification': classification_labels). The module is called as
    `module(tokens, *, token_types, segment_ids, positions, deterministic, return_hidden)`; it does not
    decode."""

    KIND = "encoder_only"

    @staticmethod
    def objectives(config: models.FamilyConfig) -> tuple[str, ...]:
        return ("classification",) if config.head == "classification" else ("mlm",)

    def required_lengths(self) -> tuple[str, ...]:
        return ("inputs",)

    @property
    def classifies(self) -> bool:
        return self.config.head == "classification"

    def batch_spec(self, lengths: Lengths, batch_size: int, *, packed: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
        rows = (batch_size, lengths["inputs"])
        spec = {ENCODER_INPUT_TOKENS: (rows, jnp.int32), ENCODER_SEGMENT_IDS: (rows, jnp.int32),
                ENCODER_TOKEN_TYPES: (rows, jnp.int32)}
        if self.classifies:
            spec[CLASSIFICATION_LABELS] = ((batch_size, 1), jnp.int32)  # [batch, 1]: rows shard as every feature
        else:
            spec.update({ENCODER_TARGET_TOKENS: (rows, jnp.int32), ENCODER_LOSS_WEIGHTS: (rows, jnp.float32)})
        if packed:
            spec[ENCODER_POSITIONS] = (rows, jnp.int32)
        return {k: jax.ShapeDtypeStruct(shape, dtype) for k, (shape, dtype) in spec.items()}

    def module_inputs(self, batch: Batch) -> tuple[tuple, dict]:
        names = {ENCODER_TOKEN_TYPES: "token_types", ENCODER_SEGMENT_IDS: "segment_ids",
                 ENCODER_POSITIONS: "positions"}
        return (batch[ENCODER_INPUT_TOKENS],), {arg: batch[k] for k, arg in names.items() if k in batch}

    def targets(self, batch: Batch) -> tuple[jax.Array, jax.Array]:
        wanted = (CLASSIFICATION_LABELS,) if self.classifies else (ENCODER_TARGET_TOKENS, ENCODER_LOSS_WEIGHTS)
        if any(name not in batch for name in wanted):
            raise UserError(f"the batch has no {' / '.join(wanted)}: the model's {self.config.head!r} head trains "
                            f"with OBJECTIVE={self.objectives(self.config)[0]!r} (a RESTORE_FROM checkpoint brings "
                            "its own head: README, 'BERT and RoBERTa', shows how to give it a classification head).")
        if self.classifies:
            labels = batch[CLASSIFICATION_LABELS][:, 0]  # NO_LABEL: a padding row, weight 0
            return jnp.maximum(labels, 0), (labels != NO_LABEL).astype(jnp.float32)
        return batch[ENCODER_TARGET_TOKENS], batch[ENCODER_LOSS_WEIGHTS].astype(jnp.float32)

    def loss_sums(self, params: Any, batch: Batch, dropout_rng: jax.Array | None = None, *,
                  z_loss: float = 0.0, cross_entropy: str = "chunked", loss_chunk_size: int = 256,
                  fp8_state: Any = None) -> LossSums:
        if not self.classifies:
            return super().loss_sums(params, batch, dropout_rng, z_loss=z_loss, cross_entropy=cross_entropy,
                                     loss_chunk_size=loss_chunk_size, fp8_state=fp8_state)
        args, kwargs = self.module_inputs(batch)
        logits, state = self.module.apply(
            variables(params, fp8_state), *args, **kwargs, deterministic=dropout_rng is None, mutable=[ROUTER_STATS],
            rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
        labels, weights = self.targets(batch)
        nll, z = cross_entropy_sums(logits, labels, weights, z_loss)
        return self.sums(nll, z, weights.sum(), state)

    def score(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
        """Masked-LM: per token, as the other kinds. Classification: per row, `log_prob` of the label,
        `correct` (the label is the argmax) and the `predictions` (argmax label)."""
        if not self.classifies:
            return super().score(params, batch)
        args, kwargs = self.module_inputs(batch)
        log_probs = jax.nn.log_softmax(self.module.apply({"params": params}, *args, **kwargs), axis=-1)
        labels = self.targets(batch)[0]
        predictions = jnp.argmax(log_probs, axis=-1)
        return {"log_prob": jnp.take_along_axis(log_probs, labels[:, None], axis=-1)[:, 0],
                "correct": predictions == labels, "predictions": predictions}

    def logits(self, params: Any, batch: Batch) -> jax.Array:
        """Masked-LM: per token, over the real vocabulary; classification: per row, one logit per label."""
        if not self.classifies:
            return super().logits(params, batch)
        args, kwargs = self.module_inputs(batch)
        return self.module.apply({"params": params}, *args, **kwargs)

    def max_lengths(self) -> dict[str, int]:
        return {"inputs": self.config.max_input_length()}

    def max_prompt_length(self, max_new_tokens: int) -> None:
        raise UserError(f"{self.config.family} is an encoder-only model: it does not generate text; use a "
                        "decoder-only or encoder-decoder checkpoint, or `t5x_like.eval.cli --task=classification`.")
