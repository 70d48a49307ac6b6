"""KV-cache decoding of token-id prompts on a mesh, under jit: the sampling settings, the Generator (batches of
left-padded prompts, one compile per padded prompt length, greedy / sampling / beam search) and the options the
generate command and `LoadedModel.generate` (inference/model.py) share, checked before anything is compiled.

Prompts of different lengths share a batch: they are left-padded, padding is masked out of the attention
(segment id 0) and positions count from each row's first real token, so every row decodes exactly as it would
alone. A row stops at the tokenizer's end-of-document id or where the model's targets end
(LanguageModel.end_ids: CPM-2's <s_1>); the loop stops when every row has."""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax import linen as nn

from partitioning import Partitioner
from t5x_like import checks
from t5x_like.errors import UserError
from t5x_like.inference import loading
from t5x_like.lm import make_lm

PROMPT_BUCKET = 64
"""Padded prompt lengths are multiples of this (capped by max_len), so few shapes compile."""


@dataclasses.dataclass(frozen=True)
class Sampling:
    """temperature 0 = greedy; top_k 0 and top_p 1 disable those filters; repetition_penalty 1 = none."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0

    def __post_init__(self):
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1 or self.repetition_penalty <= 0:
            raise UserError(f"sampling settings {self}: need temperature >= 0, top_k >= 0, 0 < top_p <= 1, "
                            "repetition_penalty > 0.")


@dataclasses.dataclass(frozen=True)
class GenerationOptions:
    """How to generate: the generate command's flags of the same names (their defaults are these) and
    LoadedModel.generate's arguments, checked when made, in the flags' names, with the fix. temperature 0 is
    greedy; num_beams > 1 searches deterministically (length_penalty), so the sampling settings stay at their
    defaults; num_samples completions per prompt; batch_size prompts decoded together."""

    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    num_beams: int = 1
    length_penalty: float = 1.0
    num_samples: int = 1
    batch_size: int = 8

    def __post_init__(self):
        checks.positive_int("--max_new_tokens", self.max_new_tokens)
        checks.positive_int("--batch_size", self.batch_size)
        checks.positive_int("--num_beams", self.num_beams, fix="1 = no beam search")
        checks.positive_int("--num_samples", self.num_samples)
        checks.finite_float("--repetition_penalty", self.repetition_penalty, minimum=0.0, exclusive_minimum=True,
                            fix="1 = no penalty")
        checks.non_negative_int("--top_k", self.top_k, fix="0 = no top-k filter")
        checks.finite_float("--temperature", self.temperature, minimum=0.0, fix="0 = greedy")
        checks.finite_float("--top_p", self.top_p, minimum=0.0, exclusive_minimum=True, maximum=1.0,
                            fix="1 = no nucleus filter")
        checks.finite_float("--length_penalty", self.length_penalty)
        if self.num_beams > 1 and (self.top_k or self.top_p < 1 or self.temperature not in (0.0, 1.0)
                                   or self.repetition_penalty != 1 or self.num_samples > 1):
            raise UserError(f"--num_beams={self.num_beams} searches deterministically; --temperature, --top_k, "
                            "--top_p, --repetition_penalty and --num_samples apply to sampling only: drop them, or "
                            "set --num_beams=1.")
        if self.num_samples > 1 and self.temperature == 0:
            raise UserError(f"--num_samples={self.num_samples} with --temperature=0 (greedy) gives "
                            f"{self.num_samples} identical completions; sample (e.g. --temperature=1 --top_k=8, "
                            "GPT2-Chinese's default) or drop --num_samples.")

    @property
    def sampling(self) -> Sampling:
        return Sampling(self.temperature, self.top_k, self.top_p, self.repetition_penalty)


DEFAULTS = GenerationOptions()


def penalize_repetition(logits: jax.Array, seen: jax.Array, penalty: float) -> jax.Array:
    """transformers' RepetitionPenaltyLogitsProcessor (Keskar et al. 2019): the logit of every id already in
    the row (prompt or generated) is divided by `penalty` when positive and multiplied by it when negative, so
    penalty > 1 makes repeats less likely. `seen` is [batch, vocab] bool."""
    penalized = jnp.where(logits < 0, logits * penalty, logits / penalty)
    return jnp.where(seen, penalized, logits)


def sample(logits: jax.Array, rng: jax.Array, settings: Sampling, seen: jax.Array | None = None) -> jax.Array:
    """One id per row from fp32 logits [batch, vocab], after the repetition penalty over `seen` (the ids each row
    holds so far), the temperature, top-k and top-p, in transformers' order."""
    if settings.repetition_penalty != 1 and seen is not None:
        logits = penalize_repetition(logits, seen, settings.repetition_penalty)
    if settings.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / settings.temperature
    lowest = jnp.finfo(jnp.float32).min
    # the candidates, most likely first: the top k (what top-k keeps is all top-p ever sees), else every id
    ordered = jax.lax.top_k(logits, settings.top_k)[0] if settings.top_k else \
        jnp.sort(logits, axis=-1)[:, ::-1] if settings.top_p < 1 else None
    if settings.top_k:
        logits = jnp.where(logits < ordered[:, -1:], lowest, logits)
    if settings.top_p < 1:  # a running sum over a vocabulary split across devices is slow: keep each row whole
        probs = jax.nn.softmax(nn.with_logical_constraint(ordered, ("batch", None)), axis=-1)
        keep = jnp.cumsum(probs, axis=-1) - probs < settings.top_p  # the most likely id is always kept
        cutoff = jnp.min(jnp.where(keep, ordered, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, lowest, logits)
    return jax.random.categorical(rng, logits).astype(jnp.int32)


def pad_prompts(prompts: Sequence[Sequence[int]], rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-pad each prompt to `length` (extra rows are one-token dummies): (tokens, valid)."""
    tokens = np.zeros((rows, length), np.int32)
    valid = np.zeros((rows, length), bool)
    for row in range(rows):
        ids = prompts[row] if row < len(prompts) else [0]
        tokens[row, length - len(ids):] = ids
        valid[row, length - len(ids):] = True
    return tokens, valid


class Generator:
    """Generates ids from token-id prompts (continuations for a decoder-only model, decoded targets
    for an encoder-decoder, whose prompts are the encoder input); compiles once per padded prompt
    length. num_beams > 1: beam search with this length penalty instead of `settings`."""

    def __init__(self, config, params, partitioner: Partitioner, *, eod_id: int, max_new_tokens: int,
                 settings: Sampling, batch_size: int = 8, num_beams: int = 1, length_penalty: float = 1.0,
                 start_id: int | None = None):
        if num_beams < 1:
            raise UserError(f"--num_beams={num_beams} must be at least 1 (1 = no beam search).")
        self.lm = make_lm(config)
        self.room = self.lm.max_prompt_length(max_new_tokens)
        self.config, self.params, self.partitioner = config, params, partitioner
        self.eod_id, self.max_new_tokens, self.settings = eod_id, max_new_tokens, settings
        self.start_id = eod_id if start_id is None else start_id
        self.num_beams, self.length_penalty = num_beams, length_penalty
        shards = partitioner.batch_shards
        self.batch_size = -(-batch_size // shards) * shards
        self._compiled: dict[int, Callable] = {}

    def decode_fn(self, prompt_len: int) -> Callable:
        """decode(params, tokens [B, P] left-padded, valid [B, P], rng) -> ids [B, max_new_tokens]
        (eod_id after a row's end of document), compiled once per padded prompt length."""
        if prompt_len not in self._compiled:
            rows = self.batch_size * self.num_beams
            shapes, specs = self.lm.cache_layout(rows, prompt_len, self.max_new_tokens)
            layout = (shapes, self.partitioner.shardings(specs))
            if self.num_beams > 1:
                search = functools.partial(self.lm.beam_search, num_beams=self.num_beams,
                                           max_new_tokens=self.max_new_tokens, eod_id=self.eod_id,
                                           length_penalty=self.length_penalty, cache_layout=layout)
                fn = lambda params, tokens, valid, rng: search(params, tokens, valid)  # noqa: E731 (deterministic)
            else:
                pick = lambda logits, rng, seen: sample(logits, rng, self.settings, seen)  # noqa: E731
                fn = functools.partial(self.lm.decode, max_new_tokens=self.max_new_tokens, eod_id=self.eod_id,
                                       sample=pick, cache_layout=layout,
                                       track_seen=self.settings.repetition_penalty != 1)
            self._compiled[prompt_len] = self.partitioner.partition(fn, None, self.partitioner.replicated)
        return self._compiled[prompt_len]

    def prompt_length(self, prompts: Sequence[Sequence[int]]) -> int:
        bucketed = -(-max(map(len, prompts)) // PROMPT_BUCKET) * PROMPT_BUCKET
        return bucketed if self.room is None else min(self.room, bucketed)

    def generate(self, prompts: Sequence[Sequence[int]], seed: int = 0, num_samples: int = 1) -> list[list[int]]:
        """Generated ids per prompt (a prompt text's token ids; the model's kind adds what training adds:
        EOS after an encoder's input), cut before the first end id (LanguageModel.end_ids). Prompts longer than the
        model's room (decoder-only: max_len - max_new_tokens) keep their last tokens; an empty prompt
        starts from the tokenizer's start of document (`start_id`; else its end-of-document id). With
        `num_samples`, each prompt is sampled that many times (its samples follow it)."""
        prompts = [self.lm.prompt_ids(p, self.eod_id) for p in prompts for _ in range(num_samples)]
        for number, ids in enumerate(prompts, 1):
            if self.room is not None and len(ids) > self.room:
                logging.warning("prompt %d is %d tokens but the model's max_len %d less --max_new_tokens=%d leaves "
                                "room for %d: its first %d tokens are dropped; shorten it or lower --max_new_tokens",
                                number, len(ids), self.room + self.max_new_tokens, self.max_new_tokens, self.room,
                                len(ids) - self.room)
        prompts = [p[-(self.room or len(p)):] if p else [self.start_id] for p in prompts]
        results = []
        sharding = self.partitioner.batch_sharding()
        for first in range(0, len(prompts), self.batch_size):
            batch = prompts[first:first + self.batch_size]
            length = self.prompt_length(batch)
            tokens, valid = pad_prompts(batch, self.batch_size, length)
            rng = jax.random.fold_in(jax.random.PRNGKey(seed), first)
            decode = self.decode_fn(length)
            with self.partitioner.activate():
                out = jax.device_get(decode(self.params, loading.global_array(tokens, sharding),
                                            loading.global_array(valid, sharding), rng))
            results.extend(cut_at(row, *self.lm.end_ids(self.eod_id)) for row in out[:len(batch)])
        return results


def cut_at(ids: np.ndarray, *end_ids: int) -> list[int]:
    """The ids before the first of `end_ids` (the model's: LanguageModel.end_ids)."""
    ids = [int(i) for i in ids]
    return ids[:min((ids.index(e) for e in end_ids if e in ids), default=len(ids))]


def check_model_fits(config, options: GenerationOptions) -> None:
    """--num_beams and --top_k within the vocabulary, and the decoding cache within memory."""
    if options.num_beams > config.vocab_size or options.top_k > config.vocab_size:
        flag, value = ("--num_beams", options.num_beams) if options.num_beams > config.vocab_size else ("--top_k", options.top_k)
        raise UserError(f"{flag}={value} exceeds the model's {config.vocab_size}-id vocabulary.")
    lm = make_lm(config)
    room = lm.max_prompt_length(options.max_new_tokens)  # bounds --max_new_tokens where the model has a max_len
    rows = -(-options.batch_size // jax.device_count()) * jax.device_count() * options.num_beams
    shapes, _ = lm.cache_layout(rows, min(room or PROMPT_BUCKET, PROMPT_BUCKET), options.max_new_tokens)
    needed = sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize for s in jax.tree.leaves(shapes))
    memory = memory_per_device() * jax.device_count()
    if needed > memory:
        raise UserError(f"--max_new_tokens={options.max_new_tokens} x --batch_size={options.batch_size} x --num_beams="
                        f"{options.num_beams}: the decoding cache alone needs {needed / 2**30:,.1f} GiB but the devices "
                        f"hold {memory / 2**30:,.1f} GiB; lower them.")


def memory_per_device() -> int:
    """Bytes of memory of one device (of the host's memory shared by its CPU devices)."""
    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // jax.device_count()


