"""The LanguageModel: what the trainer, eval, generate, compile and the benchmarks see of a model.

A LanguageModel wraps a family module (models/) and knows its batch: the feature names (seqio's,
defined once here), how a batch feeds the module, the loss sums, per-token scores, KV-cache decoding,
FLOPs and parameter counts. Three kinds exist, picked by the family registry's `kind`:

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

import functools
import math
from typing import Any, Callable, ClassVar, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

import models
from models.kernels.cross_entropy import chunked_cross_entropy, chunked_token_scores
from models.layers import FP8_STATE
from t5x_like import beam_search
from t5x_like.errors import UserError
from t5x_like.features import (CLASSIFICATION_LABELS, DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS,
                               DECODER_SEGMENT_IDS, DECODER_TARGET_TOKENS, DECODER_START_ID, ENCODER_INPUT_TOKENS,
                               ENCODER_LOSS_WEIGHTS, ENCODER_POSITIONS, ENCODER_SEGMENT_IDS, ENCODER_TARGET_TOKENS,
                               ENCODER_TOKEN_TYPES, NO_LABEL)

Batch = dict[str, jax.Array]
Lengths = Mapping[str, int]


CROSS_ENTROPY = ("chunked", "full_logits")
"""'chunked': the loss walks the sequence in chunks and never holds [batch, length, vocab] logits
(models/kernels/cross_entropy.py); 'full_logits': logits from the model, then the loss."""


def check_cross_entropy(name: str) -> None:
    if name == "xla":
        raise UserError("CROSS_ENTROPY='xla' is now called 'full_logits' (the loss over the model's full "
                         "logits); set CROSS_ENTROPY='full_logits' or 'chunked'.")
    if name not in CROSS_ENTROPY:
        raise UserError(f"CROSS_ENTROPY={name!r}: choose one of {CROSS_ENTROPY}.")


def variables(params: Any, fp8_state: Any = None) -> dict[str, Any]:
    """The module's variables: the parameters, and the FP8 matmuls' state when there is one."""
    return {"params": params} if fp8_state is None else {"params": params, FP8_STATE: fp8_state}


def cross_entropy_sums(logits: jax.Array, targets: jax.Array, weights: jax.Array,
                       z_loss: float) -> tuple[jax.Array, jax.Array]:
    """(Σ weights·nll, z_loss·Σ weights·logsumexp²) in fp32 from full logits (padding ids masked)."""
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    nll = (log_z - target_logit) * weights
    return nll.sum(), z_loss * (jnp.square(log_z) * weights).sum()


class LanguageModel:
    """A family module plus what its batches mean. Subclasses set KIND and the module call."""

    KIND: ClassVar[str]

    @staticmethod
    def objectives(config: models.FamilyConfig) -> tuple[str, ...]:
        """The data objectives (OBJECTIVE) whose batches this kind of model trains on."""
        raise NotImplementedError

    def __init__(self, config: models.FamilyConfig, module: nn.Module):
        self.config = config
        self.module = module

    # -- batches
    def batch_spec(self, lengths: Lengths, batch_size: int, *, packed: bool = False) -> dict[str, jax.ShapeDtypeStruct]:
        """Feature name -> shape and dtype of one global batch."""
        raise NotImplementedError

    def module_inputs(self, batch: Batch) -> tuple[tuple, dict]:
        """(positional, keyword) arguments of the module for a batch."""
        raise NotImplementedError

    def targets(self, batch: Batch) -> tuple[jax.Array, jax.Array]:
        """(target ids, fp32 loss weights) of a batch, each [batch, length]."""
        return batch[DECODER_TARGET_TOKENS], batch[DECODER_LOSS_WEIGHTS].astype(jnp.float32)

    def loss_weights(self, batch: Batch) -> jax.Array:
        """The fp32 weight of each scored target (what `score`'s outputs are weighted by)."""
        return self.targets(batch)[1]

    # -- parameters
    def init(self, rng: jax.Array, lengths: Lengths) -> Any:
        """Boxed parameters (logical axis names kept) for inputs of these lengths."""
        return self.init_variables(rng, lengths)["params"]

    def init_variables(self, rng: jax.Array, lengths: Lengths) -> dict[str, Any]:
        """Boxed variables by collection: 'params', and with model_config.matmul_dtype == 'fp8' the
        FP8 matmuls' scaling state (layers.FP8_STATE, see `loss_sums`)."""
        spec = self.batch_spec(lengths, 1)
        sample = {k: jnp.zeros(s.shape, s.dtype) for k, s in spec.items()}
        args, kwargs = self.module_inputs(sample)
        collections = ["params", FP8_STATE] if self.config.matmul_dtype == "fp8" else ["params"]
        return self.module.init(rng, *args, **kwargs, mutable=collections)

    @functools.cached_property
    def _abstract_params(self) -> Any:
        lengths = {k: 1 for k in self.required_lengths()}
        return jax.eval_shape(lambda: self.init(jax.random.PRNGKey(0), lengths))

    def required_lengths(self) -> tuple[str, ...]:
        raise NotImplementedError

    def abstract_params(self) -> tuple[Any, Any]:
        """(unboxed ShapeDtypeStructs, logical PartitionSpecs) of the parameters, allocating nothing."""
        boxed = self._abstract_params
        return nn.meta.unbox(boxed), nn.get_partition_spec(boxed)

    def num_params(self) -> int:
        """Parameters, excluding every vocabulary-padding row (tied or untied heads alike)."""
        abstract, specs = self.abstract_params()
        padding = self.config.padded_vocab_size - self.config.vocab_size
        total = 0
        for array, spec in zip(jax.tree.leaves(abstract), _spec_leaves(specs)):
            count = math.prod(array.shape)
            if "vocab" in tuple(spec):
                count -= count // array.shape[tuple(spec).index("vocab")] * padding
            total += count
        return total

    # -- computation
    def loss_sums(self, params: Any, batch: Batch, dropout_rng: jax.Array | None = None, *,
                  z_loss: float = 0.0, cross_entropy: str = "chunked", loss_chunk_size: int = 256,
                  fp8_state: Any = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(Σ nll, Σ z-loss, Σ weights) of one batch; dropout is on when a dropout_rng is given; the
        chunked cross-entropy takes `loss_chunk_size` positions per step. With
        `fp8_state` (init_variables' FP8_STATE) the dense matmuls run in FP8, and its gradient is the
        state's next value (flax's overwrite-with-gradient); without it, in the compute dtype."""
        args, kwargs = self.module_inputs(batch)
        outputs = self.module.apply(variables(params, fp8_state), *args, **kwargs, deterministic=dropout_rng is None,
                                    return_hidden=cross_entropy == "chunked",
                                    rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
        targets, weights = self.targets(batch)
        if cross_entropy == "chunked":
            hidden, table = outputs
            nll, z = chunked_cross_entropy(hidden, table, targets, weights, vocab_size=self.config.vocab_size,
                                           z_loss=z_loss, chunk_size=loss_chunk_size)
        else:
            nll, z = cross_entropy_sums(outputs, targets, weights, z_loss)
        return nll, z, weights.sum()

    def score(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
        """Per target token: `log_prob` of the target and `correct` (the target is the argmax), from
        the final hidden states in chunks (the batch's full logits never exist at once)."""
        args, kwargs = self.module_inputs(batch)
        hidden, table = self.module.apply({"params": params}, *args, **kwargs, return_hidden=True)
        log_prob, correct = chunked_token_scores(hidden, table, self.targets(batch)[0],
                                                 vocab_size=self.config.vocab_size)
        return {"log_prob": log_prob, "correct": correct}

    def flops_per_step(self, lengths: Lengths, batch_size: int) -> float:
        """Training FLOPs (forward + backward) of one step of `batch_size` rows."""
        return self.config.train_flops_per_example(lengths) * batch_size

    # -- decoding (generate, eval): each kind prefills its prompts, then steps one token at a time
    def prompt_ids(self, ids: Sequence[int], eod_id: int) -> list[int]:
        """The ids the model reads for a prompt text's token ids, built as training builds its inputs
        (every decode path asks this): a decoder continues the text's ids as they are."""
        return list(ids)

    def max_prompt_length(self, max_new_tokens: int) -> int | None:
        """The longest prompt that leaves room for max_new_tokens new ones (None: no limit)."""
        raise NotImplementedError

    def cache_layout(self, batch: int, prompt_length: int, max_new_tokens: int) -> tuple[Any, Any]:
        """(ShapeDtypeStructs, logical PartitionSpecs) of the decoding cache for `batch` rows."""
        raise NotImplementedError

    def prefill(self, params: Any, tokens: jax.Array, valid: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Left-padded prompts `tokens` [batch, P] (`valid` marks real tokens) and an empty cache ->
        (logits [batch, padded_vocab] of the first new token, decoding state)."""
        raise NotImplementedError

    def step(self, params: Any, tokens: jax.Array, state: Any) -> tuple[jax.Array, Any]:
        """tokens [batch, 1] -> (logits [batch, padded_vocab] of the next token, state)."""
        raise NotImplementedError

    def state_batch_axes(self, cache_specs: Any) -> Any:
        """Per leaf of the decoding state, its batch axis (or None): where beam search reorders it."""
        raise NotImplementedError

    def _empty_cache(self, cache_layout: tuple[Any, Any]) -> Any:
        shapes, shardings = cache_layout
        return jax.tree.map(lambda s, sharding: jax.lax.with_sharding_constraint(jnp.zeros(s.shape, s.dtype), sharding),
                            shapes, shardings)

    def decode(self, params: Any, tokens: jax.Array, valid: jax.Array, rng: jax.Array, *, max_new_tokens: int,
               eod_id: int, sample: Callable[[jax.Array, jax.Array], jax.Array], cache_layout: tuple[Any, Any]
               ) -> jax.Array:
        """Generated ids [batch, max_new_tokens] for left-padded prompts `tokens` [batch, P] (`valid`
        marks real tokens); `sample(logits [batch, vocab], rng)` picks each id; rows stop at eod_id
        (eod_id fills the rest). `cache_layout`: (shapes, shardings) from cache_layout(batch, P, max_new_tokens)."""
        batch = tokens.shape[0]
        logits, state = self.prefill(params, tokens, valid, self._empty_cache(cache_layout))
        out = jnp.full((batch, max_new_tokens), eod_id, jnp.int32)

        def unfinished(loop):
            i, _, done, *_ = loop
            return (i < max_new_tokens) & ~done.all()

        def body(loop):
            i, out, done, logits, state = loop
            token = jnp.where(done, eod_id, sample(logits, jax.random.fold_in(rng, i)))
            logits, state = self.step(params, token[:, None], state)
            return i + 1, out.at[:, i].set(token), done | (token == eod_id), logits, state

        return jax.lax.while_loop(unfinished, body, (0, out, jnp.zeros(batch, bool), logits, state))[1]

    def beam_search(self, params: Any, tokens: jax.Array, valid: jax.Array, *, num_beams: int, max_new_tokens: int,
                    eod_id: int, length_penalty: float, cache_layout: tuple[Any, Any]) -> jax.Array:
        """The best beam's ids [batch, max_new_tokens] (eod_id after its end) for prompts as in decode;
        t5x_like/beam_search.py scores and stops. `cache_layout` is for batch·num_beams rows."""
        rows, prompt_length = tokens.shape[0] * num_beams, tokens.shape[1]
        tokens, valid = jnp.repeat(tokens, num_beams, axis=0), jnp.repeat(valid, num_beams, axis=0)
        logits, state = self.prefill(params, tokens, valid, self._empty_cache(cache_layout))
        batch_axes = self.state_batch_axes(self.cache_layout(rows, prompt_length, max_new_tokens)[1])
        sequences, _ = beam_search.beam_search(
            lambda token, state: self.step(params, token, state), logits, state, batch_axes, num_beams=num_beams,
            max_new_tokens=max_new_tokens, start_id=eod_id, eos_id=eod_id, pad_id=eod_id,
            vocab_size=self.config.vocab_size, length_penalty=length_penalty)
        return sequences[:, 0, 1:]


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

    # -- decoding: encode the prompts once; the decoder starts from DECODER_START_ID and caches its
    # self-attention keys/values and the encoder output's cross-attention keys/values
    def max_prompt_length(self, max_new_tokens: int) -> None:
        if max_new_tokens < 1:
            raise UserError(f"--max_new_tokens={max_new_tokens} must be at least 1.")
        return None

    def prompt_ids(self, ids: Sequence[int], eod_id: int) -> list[int]:
        """The encoder reads EOS after the text, as in training (span corruption and seq2seq append it to
        every input), seqio and transformers' T5 tokenizer."""
        return [*ids, eod_id]

    def cache_layout(self, batch: int, prompt_length: int, max_new_tokens: int) -> tuple[Any, Any]:
        def create(params):
            inputs = jnp.zeros((batch, prompt_length), jnp.int32)
            encoded = self.module.apply({"params": params}, inputs, method="encode")
            return self.module.apply({"params": params}, encoded, jnp.zeros((batch, 1 + max_new_tokens), jnp.int32),
                                     encoder_segment_ids=inputs, method="decode", mutable=["cache"])[1]["cache"]

        boxed = jax.eval_shape(create, self.abstract_params()[0])
        return nn.meta.unbox(boxed), nn.get_partition_spec(boxed)

    def prefill(self, params: Any, tokens: jax.Array, valid: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """The prompts are the encoder's input; the state is (cache, the encoder's padding mask)."""
        mask = valid.astype(jnp.int32)
        positions = jnp.maximum(jnp.cumsum(valid, axis=1) - 1, 0)
        encoded = self.module.apply({"params": params}, tokens, encoder_segment_ids=mask,
                                    encoder_positions=positions, method="encode")
        start = jnp.full((tokens.shape[0], 1), DECODER_START_ID, jnp.int32)
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
                  fp8_state: Any = None) -> tuple[jax.Array, jax.Array, jax.Array]:
        if not self.classifies:
            return super().loss_sums(params, batch, dropout_rng, z_loss=z_loss, cross_entropy=cross_entropy,
                                     loss_chunk_size=loss_chunk_size, fp8_state=fp8_state)
        args, kwargs = self.module_inputs(batch)
        logits = self.module.apply(variables(params, fp8_state), *args, **kwargs, deterministic=dropout_rng is None,
                                   rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
        labels, weights = self.targets(batch)
        nll, z = cross_entropy_sums(logits, labels, weights, z_loss)
        return nll, z, weights.sum()

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

    def max_prompt_length(self, max_new_tokens: int) -> None:
        raise UserError(f"{self.config.family} is an encoder-only model: it does not generate text; use a "
                        "decoder-only or encoder-decoder checkpoint, or `t5x_like.eval --task=classification`.")


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


def _spec_leaves(specs: Any) -> list[PartitionSpec]:
    return jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
