"""Scoring rows of targets with a LanguageModel on a mesh: per-row log-likelihoods, argmax correctness, in
fixed-size global batches (one compile), and the overlapping windows that score a long token stream."""
from __future__ import annotations

import math
import sys
from typing import Any, Callable, Iterable

import jax
import numpy as np
from tqdm import tqdm

from partitioning import Partitioner
from t5x_like.cluster import processes
from t5x_like.errors import UserError
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS
from t5x_like.inference import loading
from t5x_like.lm import LanguageModel, make_lm

Rows = dict[str, np.ndarray]  # INPUTS, TARGETS, WEIGHTS: [rows, length]
INPUTS, TARGETS, WEIGHTS = DECODER_INPUT_TOKENS, DECODER_TARGET_TOKENS, DECODER_LOSS_WEIGHTS


def make_score_fn(lm: LanguageModel) -> Callable[[Any, Rows], dict[str, jax.Array]]:
    """Per row: Σ weighted nll, and whether every weighted target is the argmax."""

    def score(params, rows):
        scores = lm.score(params, rows)
        weights = rows[WEIGHTS]
        hit = scores["correct"] | (weights == 0)
        return {"nll": -(scores["log_prob"] * weights).sum(-1), "all_correct": hit.all(-1),
                "num_correct": (scores["correct"] * weights).sum(-1)}

    return score


class Scorer:
    """Scores rows in fixed-size global batches (one compile), sharded by the partitioner."""

    def __init__(self, config, params, partitioner: Partitioner, batch_size: int):
        shards = partitioner.batch_shards
        self.batch_size = -(-batch_size // shards) * shards
        self.params = params
        self.partitioner = partitioner
        self.sharding = partitioner.batch_sharding()
        with partitioner.activate():
            self._fn = jax.jit(make_score_fn(make_lm(config)), out_shardings=partitioner.replicated)

    def score(self, batches: Iterable[Rows], total: int, description: str) -> dict[str, np.ndarray]:
        """Concatenated per-row results over `batches` (each at most batch_size rows)."""
        results: dict[str, list[np.ndarray]] = {"nll": [], "all_correct": [], "num_correct": []}
        with self.partitioner.activate():
            for rows in tqdm(batches, total=total, desc=description, unit="batch", file=sys.stderr,
                             disable=not processes.is_primary()):
                count = len(rows[INPUTS])
                padded = {k: pad_rows(v, self.batch_size) for k, v in rows.items()}
                out = jax.device_get(self._fn(self.params, {k: loading.global_array(v, self.sharding)
                                                            for k, v in padded.items()}))
                for key in results:
                    results[key].append(np.asarray(out[key][:count]))
        return {k: np.concatenate(v) for k, v in results.items()}


def pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """Append zero rows (zero weight) up to `rows`."""
    return np.pad(array, [(0, rows - len(array))] + [(0, 0)] * (array.ndim - 1))


def num_windows(num_tokens: int, seq_len: int, stride: int) -> int:
    """Windows needed so that each of the num_tokens-1 targets is scored once."""
    return 1 + -(-max(num_tokens - 1 - seq_len, 0) // stride)


def window_rows(tokens: np.ndarray, seq_len: int, stride: int, first: int, count: int) -> Rows:
    """Windows first..first+count-1: inputs tokens[s:s+seq_len], targets shifted by one, weight 1 on
    the targets the window scores (all for window 0, the last `stride` for later ones; 0 past the end)."""
    rows = {k: np.zeros((count, seq_len), np.int32) for k in (INPUTS, TARGETS)}
    rows[WEIGHTS] = np.zeros((count, seq_len), np.float32)
    for row, window in enumerate(range(first, first + count)):
        start = window * stride
        chunk = np.asarray(tokens[start:start + seq_len + 1])
        n = len(chunk) - 1
        rows[INPUTS][row, :n] = chunk[:-1]
        rows[TARGETS][row, :n] = chunk[1:]
        rows[WEIGHTS][row, 0 if window == 0 else seq_len - stride:n] = 1.0
    return rows


def score_stream(scorer: Scorer, tokens: np.ndarray, seq_len: int, stride: int, description: str,
                 max_windows: int | None = None) -> tuple[float, int]:
    """(Σ nll, number of targets scored) over a token stream in strided windows: all of its targets,
    or those of its first `max_windows` windows."""
    if not 0 < stride <= seq_len:
        raise UserError(f"--stride={stride} must be between 1 and --seq_len={seq_len}.")
    if len(tokens) < 2:
        raise UserError(f"{description}: {len(tokens)} tokens, nothing to score.")
    total = num_windows(len(tokens), seq_len, stride)
    if max_windows is not None and max_windows < total:
        total = max_windows
        tokens = tokens[:seq_len + 1 + (total - 1) * stride]
    size = scorer.batch_size
    batches = (window_rows(tokens, seq_len, stride, first, min(size, total - first))
               for first in range(0, total, size))
    nll = float(scorer.score(batches, -(-total // size), description)["nll"].astype(np.float64).sum())
    return nll, len(tokens) - 1


def safe_exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")
