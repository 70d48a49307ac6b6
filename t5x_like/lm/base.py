"""What every kind of LanguageModel shares: the base class (batches, parameters, loss sums, scores, decoding,
FLOPs) and the loss helpers."""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, ClassVar, Mapping, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

import models
from models.kernels.cross_entropy import chunked_cross_entropy, chunked_token_scores
from models.layers import FP8_STATE, ROUTER_STATS, router_losses
from t5x_like.errors import UserError
from t5x_like.features import DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS
from t5x_like.lm import beam_search

Batch = dict[str, jax.Array]


Lengths = Mapping[str, int]


class LossSums(NamedTuple):
    """One batch's loss terms, each summed over its scored tokens (a step adds them over microbatches and
    divides by the total weight): the cross-entropy, the z-loss, the weight, and the auxiliary losses the
    model's layers report (a mixture of experts: models.layers.router_losses's, each times the weight)."""

    nll: jax.Array
    z_loss: jax.Array
    weight: jax.Array
    auxiliary: dict[str, jax.Array]


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
        boxed = self._abstract_params  # unboxed without sharding constraints: they are shapes (and a training
        is_box = lambda x: isinstance(x, nn.meta.AxisMetadata)  # mesh may be active, lm-eval during training)
        unboxed = jax.tree.map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, boxed, is_leaf=is_box)
        return unboxed, nn.get_partition_spec(boxed)

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
                  fp8_state: Any = None) -> LossSums:
        """The loss sums of one batch; dropout is on when a dropout_rng is given; the
        chunked cross-entropy takes `loss_chunk_size` positions per step. With
        `fp8_state` (init_variables' FP8_STATE) the dense matmuls run in FP8, and its gradient is the
        state's next value (flax's overwrite-with-gradient); without it, in the compute dtype."""
        args, kwargs = self.module_inputs(batch)
        outputs, state = self.module.apply(
            variables(params, fp8_state), *args, **kwargs, deterministic=dropout_rng is None,
            return_hidden=cross_entropy == "chunked", mutable=[ROUTER_STATS],
            rngs={"dropout": dropout_rng} if dropout_rng is not None else None)
        targets, weights = self.targets(batch)
        if cross_entropy == "chunked":
            hidden, table = outputs
            nll, z = chunked_cross_entropy(hidden, table, targets, weights, vocab_size=self.config.vocab_size,
                                           z_loss=z_loss, chunk_size=loss_chunk_size)
        else:
            nll, z = cross_entropy_sums(outputs, targets, weights, z_loss)
        return self.sums(nll, z, weights.sum(), state)

    @staticmethod
    def sums(nll: jax.Array, z: jax.Array, weight: jax.Array, state: Mapping[str, Any]) -> LossSums:
        """LossSums with the router losses of the layers' sown statistics (`state`), each times the weight."""
        auxiliary = {name: value * weight for name, value in router_losses(state.get(ROUTER_STATS, {})).items()}
        return LossSums(nll, z, weight, auxiliary)

    def score(self, params: Any, batch: Batch) -> dict[str, jax.Array]:
        """Per target token: `log_prob` of the target and `correct` (the target is the argmax), from
        the final hidden states in chunks (the batch's full logits never exist at once)."""
        args, kwargs = self.module_inputs(batch)
        hidden, table = self.module.apply({"params": params}, *args, **kwargs, return_hidden=True)
        log_prob, correct = chunked_token_scores(hidden, table, self.targets(batch)[0],
                                                 vocab_size=self.config.vocab_size)
        return {"log_prob": log_prob, "correct": correct}

    def logits(self, params: Any, batch: Batch) -> jax.Array:
        """fp32 logits over the real vocabulary (its padding ids cut) at every position the batch's inputs feed."""
        args, kwargs = self.module_inputs(batch)
        return self.module.apply({"params": params}, *args, **kwargs)[..., :self.config.vocab_size]

    def max_lengths(self) -> dict[str, int]:
        """The most tokens a row of each feature length ('inputs', 'targets') may hold, where the model has a limit."""
        return {}

    def flops_per_step(self, lengths: Lengths, batch_size: int) -> float:
        """Training FLOPs (forward + backward) of one step of `batch_size` rows."""
        return self.config.train_flops_per_example(lengths) * batch_size

    def source_settings(self) -> dict[str, Any]:
        """What the training data source (data.make_source) must know of this model to build its rows."""
        return {}

    # -- decoding (generate, eval): each kind prefills its prompts, then steps one token at a time
    def prompt_ids(self, ids: Sequence[int], eod_id: int) -> list[int]:
        """The ids the model reads for a prompt text's token ids, built as training builds its inputs
        (every decode path asks this): a decoder continues the text's ids as they are."""
        return list(ids)

    def end_ids(self, eod_id: int) -> tuple[int, ...]:
        """The ids a generation stops at, the one training ends its targets with first (a decoder: EOD)."""
        return (eod_id,)

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
               eod_id: int, sample: Callable[[jax.Array, jax.Array, jax.Array | None], jax.Array],
               cache_layout: tuple[Any, Any], track_seen: bool = True) -> jax.Array:
        """Generated ids [batch, max_new_tokens] for left-padded prompts `tokens` [batch, P] (`valid`
        marks real tokens); `sample(logits [batch, vocab], rng, seen)` picks each id, `seen` [batch, vocab] bool
        marking the ids the row's text holds so far (for a repetition penalty; None without `track_seen`); rows
        stop at an id of end_ids(eod_id) (eod_id fills the rest). `cache_layout`: (shapes, shardings) from cache_layout(batch, P,
        max_new_tokens)."""
        batch = tokens.shape[0]
        logits, state = self.prefill(params, tokens, valid, self._empty_cache(cache_layout))
        out = jnp.full((batch, max_new_tokens), eod_id, jnp.int32)
        rows, ends = jnp.arange(batch), jnp.asarray(self.end_ids(eod_id), jnp.int32)

        def unfinished(loop):
            i, _, done, *_ = loop
            return (i < max_new_tokens) & ~done.all()

        def body(loop):
            i, out, done, logits, state, seen = loop
            token = jnp.where(done, eod_id, sample(logits, jax.random.fold_in(rng, i), seen))
            logits, state = self.step(params, token[:, None], state)
            seen = None if seen is None else seen.at[rows, token].set(True)
            return i + 1, out.at[:, i].set(token), done | jnp.isin(token, ends), logits, state, seen

        seen = self.seen_before(tokens, valid, logits.shape[-1]) if track_seen else None
        start = (0, out, jnp.zeros(batch, bool), logits, state, seen)
        return jax.lax.while_loop(unfinished, body, start)[1]

    def seen_before(self, tokens: jax.Array, valid: jax.Array, vocab: int) -> jax.Array:
        """[batch, vocab] bool: the ids of the text a row's first new token continues (a decoder's prompt)."""
        ids = jnp.where(valid, tokens, vocab)  # padding goes to a column dropped below
        seen = jnp.zeros((tokens.shape[0], vocab + 1), bool).at[jnp.arange(tokens.shape[0])[:, None], ids].set(True)
        return seen[:, :vocab]

    def beam_search(self, params: Any, tokens: jax.Array, valid: jax.Array, *, num_beams: int, max_new_tokens: int,
                    eod_id: int, length_penalty: float, cache_layout: tuple[Any, Any]) -> jax.Array:
        """The best beam's ids [batch, max_new_tokens] (eod_id after its end) for prompts as in decode, a beam
        finishing at the id training ends targets with (end_ids' first);
        t5x_like/lm/beam_search.py scores and stops. `cache_layout` is for batch·num_beams rows."""
        rows, prompt_length = tokens.shape[0] * num_beams, tokens.shape[1]
        tokens, valid = jnp.repeat(tokens, num_beams, axis=0), jnp.repeat(valid, num_beams, axis=0)
        logits, state = self.prefill(params, tokens, valid, self._empty_cache(cache_layout))
        batch_axes = self.state_batch_axes(self.cache_layout(rows, prompt_length, max_new_tokens)[1])
        sequences, _ = beam_search.beam_search(
            lambda token, state: self.step(params, token, state), logits, state, batch_axes, num_beams=num_beams,
            max_new_tokens=max_new_tokens, start_id=eod_id, eos_id=self.end_ids(eod_id)[0], pad_id=eod_id,
            vocab_size=self.config.vocab_size, length_penalty=length_penalty)
        return sequences[:, 0, 1:]


def _spec_leaves(specs: Any) -> list[PartitionSpec]:
    return jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
