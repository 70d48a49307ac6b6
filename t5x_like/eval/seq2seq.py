"""Seq2seq pairs with an encoder-decoder checkpoint: loss and token accuracy of the teacher-forced targets, and
exact match of the greedily decoded text with the target text."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from t5x_like.data.objectives import seq2seq
from t5x_like.eval.scoring import INPUTS, TARGETS, WEIGHTS, Rows, Scorer, safe_exp
from t5x_like.features import DECODER_START_ID, ENCODER_INPUT_TOKENS, ENCODER_SEGMENT_IDS
from t5x_like.inference import decoding


def seq2seq_rows(examples: Sequence[tuple[list[int], list[int]]], inputs_len: int, targets_len: int,
                 start_ids: Sequence[int] = (DECODER_START_ID,)) -> Rows:
    """Teacher-forced rows: encoder inputs (+ padding mask), the decoder reading the start ids and the targets
    (T5: shifted right from DECODER_START_ID; CPM-2: <s>, <s_0> first, <s_0> being the first label)."""
    rows = {ENCODER_INPUT_TOKENS: np.zeros((len(examples), inputs_len), np.int32),
            ENCODER_SEGMENT_IDS: np.zeros((len(examples), inputs_len), np.int32),
            INPUTS: np.zeros((len(examples), targets_len), np.int32),
            TARGETS: np.zeros((len(examples), targets_len), np.int32),
            WEIGHTS: np.zeros((len(examples), targets_len), np.float32)}
    for row, (inputs, targets) in enumerate(examples):
        targets = [*start_ids[1:], *targets]
        rows[ENCODER_INPUT_TOKENS][row, :len(inputs)] = inputs
        rows[ENCODER_SEGMENT_IDS][row, :len(inputs)] = 1
        rows[INPUTS][row, :len(targets)] = [start_ids[0]] + targets[:-1]
        rows[TARGETS][row, :len(targets)] = targets
        rows[WEIGHTS][row, :len(targets)] = 1
    return rows


def evaluate_seq2seq(scorer: Scorer, generator_for: Callable[[int], decoding.Generator], tokenizer,
                     path: str, max_examples: int | None = None) -> dict:
    pairs = seq2seq.read_pairs(path)[:max_examples]
    texts = [tokenizer.encode(i) for i, _ in pairs]
    generator = generator_for(max(len(tokenizer.encode(t)) for _, t in pairs) + 1)
    targets = [generator.lm.target_ids(tokenizer.encode(t), tokenizer.eod_id) for _, t in pairs]
    start_ids = generator.lm.start_ids()
    targets_len = max(map(len, targets)) + len(start_ids) - 1
    examples = [(generator.lm.prompt_ids(i, tokenizer.eod_id), t) for i, t in zip(texts, targets)]  # as decoded
    inputs_len = max(len(i) for i, _ in examples)
    batches = (seq2seq_rows(examples[i:i + scorer.batch_size], inputs_len, targets_len, start_ids)
               for i in range(0, len(examples), scorer.batch_size))
    scores = scorer.score(batches, -(-len(examples) // scorer.batch_size), "seq2seq")
    decoded = generator.generate(texts)
    exact = sum(tokenizer.decode(ids) == target for ids, (_, target) in zip(decoded, pairs))
    num_tokens = sum(len(t) + len(start_ids) - 1 for _, t in examples)
    loss = float(scores["nll"].sum()) / num_tokens
    return {"task": "seq2seq", "num_examples": len(pairs), "num_target_tokens": num_tokens, "loss": loss,
            "ppl": safe_exp(loss), "token_accuracy": float(scores["num_correct"].sum()) / num_tokens,
            "exact_match": exact / len(pairs)}
