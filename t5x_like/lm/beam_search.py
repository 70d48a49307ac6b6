"""Beam search over a KV-cached decoder, batched and under jit (one lax.while_loop).

The search is transformers' (GenerationMixin._beam_search with early_stopping=False), so the two
agree token for token: each step keeps the top 2·beams continuations of all beams; among them an
end-of-sequence candidate that ranks within the top `beams` becomes a finished hypothesis, scored
sum(log p) / length ** length_penalty, where length counts the generated tokens with the EOS (HF's
convention, not T5X's ((5 + length) / 6) ** alpha); the best `beams` others run on. A row stops
when its best running beam, scored at the current length, cannot beat its worst finished one.

The model is reached only through `step(tokens [batch·beams, 1], cache) -> (logits, cache)`, and the
cache is reordered along each leaf's batch axis, named by `cache_batch_axes`.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

NEG = -1.0e9
"""Score of an impossible hypothesis (HF's value)."""

Step = Callable[[jax.Array, Any], tuple[jax.Array, Any]]


def cache_batch_axes(specs: Any) -> Any:
    """Per cache leaf, from its logical PartitionSpec, the axis named 'activation_batch', or None
    (e.g. a scalar cache index): where beam_search reorders the cache."""
    def axis(spec):
        return tuple(spec).index("activation_batch") if "activation_batch" in tuple(spec) else None

    return jax.tree.map(axis, specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def gather_beams(x: jax.Array, indices: jax.Array) -> jax.Array:
    """x [batch, n, ...] -> [batch, k, ...] taking indices [batch, k] along axis 1."""
    return jnp.take_along_axis(x, indices.reshape(indices.shape + (1,) * (x.ndim - 2)), axis=1)


def first_beams(logits: jax.Array, cache: Any, batch: int, num_beams: int, length: int, start_id: int,
                pad_id: int) -> dict[str, Any]:
    """The search's state before its first step: every row's beams hold the start token, the first beam alone
    scored (the others, equal to it, start at NEG), nothing finished."""
    running = jnp.full((batch, num_beams, length), pad_id, jnp.int32).at[:, :, 0].set(start_id)
    return dict(cur_len=jnp.int32(1), logits=logits, cache=cache, running=running,
                running_scores=jnp.zeros((batch, num_beams)).at[:, 1:].set(NEG), sequences=running,
                scores=jnp.full((batch, num_beams), NEG), finished=jnp.zeros((batch, num_beams), bool),
                open=jnp.ones((batch, 1), bool), all_hit=jnp.bool_(False))


def beam_search(step: Step, logits: jax.Array, cache: Any, batch_axes: Any, *, num_beams: int,
                max_new_tokens: int, start_id: int, eos_id: int, pad_id: int, vocab_size: int,
                length_penalty: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Beam search from the start token, whose next-token `logits` [batch·beams, vocab] and `cache`
    (rows batch-major: row b·beams + k) the caller has computed already; every beam of a row starts
    the same. Returns (sequences [batch, beams, 1 + max_new_tokens]: the start token, the generated
    tokens, pad after EOS; best first, and their scores [batch, beams])."""
    batch = logits.shape[0] // num_beams
    length = 1 + max_new_tokens
    state = first_beams(logits, cache, batch, num_beams, length, start_id, pad_id)
    top_mask = jnp.arange(2 * num_beams) < num_beams

    def search_step(s):
        cur_len = s["cur_len"]
        log_probs = jax.nn.log_softmax(s["logits"][:, :vocab_size].astype(jnp.float32), axis=-1)
        log_probs = log_probs.reshape(batch, num_beams, vocab_size) + s["running_scores"][:, :, None]
        topk_scores, topk_index = jax.lax.top_k(log_probs.reshape(batch, -1), 2 * num_beams)
        origin, ids = topk_index // vocab_size, (topk_index % vocab_size).astype(jnp.int32)
        topk_seqs = gather_beams(s["running"], origin)
        topk_seqs = jax.vmap(lambda seq, tok: jax.lax.dynamic_update_slice_in_dim(seq, tok[:, None], cur_len, 1))(
            topk_seqs, ids)
        hits = (ids == eos_id) | (cur_len + 1 >= length)
        running_candidates = topk_scores + NEG * hits
        keep = jax.lax.top_k(running_candidates, num_beams)[1]
        finishing = hits & top_mask
        candidates = (topk_scores / cur_len.astype(jnp.float32) ** length_penalty
                      + NEG * ~s["open"] + NEG * ~finishing)
        merged = jnp.concatenate([s["scores"], candidates], axis=1)
        best = jax.lax.top_k(merged, num_beams)[1]
        scores = gather_beams(merged, best)
        finished = gather_beams(jnp.concatenate([s["finished"], finishing], axis=1), best)
        running_scores = gather_beams(running_candidates, keep)
        rows = (jnp.arange(batch)[:, None] * num_beams + gather_beams(origin, keep)).reshape(-1)
        cache = jax.tree.map(lambda x, axis: x if axis is None else jnp.take(x, rows, axis=axis), s["cache"],
                             batch_axes)
        running = gather_beams(topk_seqs, keep)
        logits, cache = step(running[:, :, cur_len].reshape(-1, 1), cache)
        best_running = running_scores[:, :1] / cur_len.astype(jnp.float32) ** length_penalty
        worst_finished = jnp.where(finished, scores.min(axis=1, keepdims=True), NEG)
        return dict(
            cur_len=cur_len + 1, logits=logits, cache=cache, running=running, running_scores=running_scores,
            sequences=gather_beams(jnp.concatenate([s["sequences"], topk_seqs], axis=1), best), scores=scores,
            finished=finished, open=s["open"] & jnp.any(best_running > worst_finished, axis=-1, keepdims=True),
            all_hit=jnp.all(hits))

    def unfinished(s):
        return (s["cur_len"] < length) & jnp.any(s["open"]) & ~s["all_hit"]

    final = jax.lax.while_loop(unfinished, search_step, state)
    return final["sequences"], final["scores"]
