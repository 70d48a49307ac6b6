"""LAMBADA last-word accuracy: strict whole words (every token of " " + the last word the argmax), or the last
BPE token only."""
from __future__ import annotations

import json
from typing import Sequence

import numpy as np

from t5x_like.errors import UserError
from t5x_like.eval.scoring import INPUTS, TARGETS, WEIGHTS, Rows, Scorer, safe_exp
from t5x_like.eval.wikitext import read_text


def lambada_example(tokenizer, text: str, strict: bool, bos_id: int | None = None) -> tuple[list[int], list[int]]:
    """(context ids, target ids), the context after `bos_id` when there is one (the tokenizer's beginning-of-text,
    as lm-eval's hf backend encodes a context). Strict: the target is " " + the last whitespace-separated word."""
    first = [] if bos_id is None else [bos_id]
    if not strict:
        ids = tokenizer.encode(text)
        return first + ids[:-1], ids[-1:]
    last_word = text.split()[-1]
    start = text.rfind(last_word)
    return first + tokenizer.encode(text[:start].strip()), tokenizer.encode(" " + last_word)


def lambada_rows(examples: Sequence[tuple[list[int], list[int]]], length: int) -> Rows:
    """One row per example, right-padded; contexts longer than length+1 lose their start."""
    rows = {k: np.zeros((len(examples), length), np.int32) for k in (INPUTS, TARGETS)}
    rows[WEIGHTS] = np.zeros((len(examples), length), np.float32)
    for row, (context, target) in enumerate(examples):
        ids = (context + target)[-(length + 1):]
        n = len(ids) - 1
        rows[INPUTS][row, :n] = ids[:-1]
        rows[TARGETS][row, :n] = ids[1:]
        rows[WEIGHTS][row, n - len(target):n] = 1.0
    return rows


def read_lambada(path: str) -> list[str]:
    texts = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        if line.strip():
            try:
                texts.append(json.loads(line)["text"])
            except (ValueError, KeyError, TypeError):
                raise UserError(f"--data={path}:{number}: not a JSON object with a 'text' field; LAMBADA's "
                                "lines are {\"text\": \"...\"}.") from None
    return texts


def evaluate_lambada(scorer: Scorer, tokenizer, path: str, seq_len: int, strict: bool,
                     max_examples: int | None = None, bos_id: int | None = None) -> dict:
    examples = [lambada_example(tokenizer, text, strict, bos_id) for text in read_lambada(path)[:max_examples]]
    if not examples:
        raise UserError(f"{path}: no examples (expected JSON lines with a 'text' field).")
    longest = max(len(c) + len(t) - 1 for c, t in examples)
    length = min(seq_len, -(-longest // 64) * 64)
    size = scorer.batch_size
    batches = (lambada_rows(examples[i:i + size], length) for i in range(0, len(examples), size))
    out = scorer.score(batches, -(-len(examples) // size), "lambada")
    num_target_tokens = sum(len(t) for _, t in examples)
    loss = float(out["nll"].astype(np.float64).sum()) / num_target_tokens
    correct = int(out["all_correct"].sum())
    return {"task": "lambada", "method": "strict whole word" if strict else "last BPE token",
            "accuracy": correct / len(examples), "num_correct": correct, "num_examples": len(examples),
            "loss": loss, "ppl": safe_exp(loss), "num_target_tokens": num_target_tokens, "seq_len": length}
