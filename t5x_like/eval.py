"""`python -m t5x_like.eval`: zero-shot evaluation of a checkpoint, the Megatron-LM way.

    python -m t5x_like.eval --task=wikitext --checkpoint=MODEL_DIR --data=wiki.test.tokens \
        --seq_len=1024 --stride=32 --output=wikitext.json
    python -m t5x_like.eval --task=lambada --checkpoint=MODEL_DIR --data=lambada_test.jsonl
    python -m t5x_like.eval --task=tokens --checkpoint=MODEL_DIR --data=PREFIX   # a token file

wikitext: read the whole file, count original tokens as len(text.strip().split(" ")), detokenize,
tokenize, then score overlapping windows of seq_len+1 tokens that start every `stride` tokens; the
first window scores all its seq_len targets, every later one only its last `stride` (so each
target is scored once, with at least seq_len-stride tokens of context). loss = Σnll / (tokens-1),
ppl = exp(loss), adjusted_ppl = exp(Σnll / (original tokens-1)) (the GPT-2 paper's word-level
number, comparable across tokenizers).
lambada: last-word accuracy; strict (default): the target is " " + last word and counts only if
every target token is the argmax; --lambada_last_token: only the last BPE token is predicted.
tokens: loss / ppl over a preprocessed token file (documents back to back, as stored).

"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from partitioning import Partitioner
from t5x_like import inference
from t5x_like.errors import exit_on_user_error
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS
from t5x_like.lm import LanguageModel, make_lm

# ---------------------------------------------------------------- scoring


Rows = dict[str, np.ndarray]  # INPUTS, TARGETS, WEIGHTS: [rows, length]
INPUTS, TARGETS, WEIGHTS = DECODER_INPUT_TOKENS, DECODER_TARGET_TOKENS, DECODER_LOSS_WEIGHTS


def make_score_fn(lm: LanguageModel) -> Callable[[Any, Rows], dict[str, jax.Array]]:
    """Per row: Σ weighted nll, and whether every weighted target is the argmax."""

    def score(params, rows):
        scores = lm.score(params, rows)
        weights = rows[WEIGHTS]
        hit = scores["correct"] | (weights == 0)
        return {"nll": -(scores["log_prob"] * weights).sum(-1), "all_correct": hit.all(-1)}

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
        results: dict[str, list[np.ndarray]] = {"nll": [], "all_correct": []}
        with self.partitioner.activate():
            for rows in tqdm(batches, total=total, desc=description, unit="batch", file=sys.stderr):
                count = len(rows[INPUTS])
                padded = {k: pad_rows(v, self.batch_size) for k, v in rows.items()}
                out = jax.device_get(self._fn(self.params, {k: inference.global_array(v, self.sharding)
                                                            for k, v in padded.items()}))
                for key in results:
                    results[key].append(np.asarray(out[key][:count]))
        return {k: np.concatenate(v) for k, v in results.items()}


def pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
    """Append zero rows (zero weight) up to `rows`."""
    return np.pad(array, [(0, rows - len(array))] + [(0, 0)] * (array.ndim - 1))


# ---------------------------------------------------------------- WikiText


_WIKITEXT_RULES: tuple[tuple[str, str, bool], ...] = (
    # (pattern, replacement, is_regex), applied in order; Megatron-LM's zero-shot detokenizer.
    ("s '", "s'", False),
    (" @-@ ", "-", False),
    (" @,@ ", ",", False),
    (" @.@ ", ".", False),
    (" : ", ": ", False),
    (" ; ", "; ", False),
    (" . ", ". ", False),
    (" ! ", "! ", False),
    (" ? ", "? ", False),
    (" , ", ", ", False),
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)", True),
    (r"\[\s*([^\]]*?)\s*\]", r"[\1]", True),
    (r"{\s*([^}]*?)\s*}", r"{\1}", True),
    (r"\"\s*([^\"]*?)\s*\"", r'"\1"', True),
    (r"'\s*([^']*?)\s*'", r"'\1'", True),
    ("= = = =", "====", False),
    ("= = =", "===", False),
    ("= =", "==", False),
    (" \u00b0 ", "\u00b0", False),
    (" \n", "\n", False),
    ("\n ", "\n", False),
    (" N ", " 1 ", False),
    (" 's", "'s", False),
)


def wikitext_detokenize(text: str) -> str:
    """Undo WikiText's tokenization (@-@ number separators, spaced punctuation, brackets, quotes,
    '= = heading = =' markers), as Megatron-LM does before GPT-2 tokenization."""
    for pattern, replacement, is_regex in _WIKITEXT_RULES:
        text = re.sub(pattern, replacement, text) if is_regex else text.replace(pattern, replacement)
    return text


def count_original_tokens(text: str) -> int:
    """WikiText's own token count (the denominator of the GPT-2 paper's perplexities)."""
    return len(text.strip().split(" "))


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


def score_stream(scorer: Scorer, tokens: np.ndarray, seq_len: int, stride: int, description: str) -> float:
    """Σ nll over every target of a token stream, in strided windows."""
    if not 0 < stride <= seq_len:
        raise ValueError(f"--stride={stride} must be between 1 and --seq_len={seq_len}.")
    if len(tokens) < 2:
        raise ValueError(f"{description}: {len(tokens)} tokens, nothing to score.")
    total = num_windows(len(tokens), seq_len, stride)
    size = scorer.batch_size
    batches = (window_rows(tokens, seq_len, stride, first, min(size, total - first))
               for first in range(0, total, size))
    return float(scorer.score(batches, -(-total // size), description)["nll"].astype(np.float64).sum())


def evaluate_wikitext(scorer: Scorer, tokenizer, path: str, seq_len: int, stride: int) -> dict:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    num_original = count_original_tokens(text)
    tokens = np.asarray(tokenizer.encode(wikitext_detokenize(text)), np.int32)
    nll = score_stream(scorer, tokens, seq_len, stride, "wikitext")
    loss = nll / (len(tokens) - 1)
    return {"task": "wikitext", "loss": loss, "ppl": safe_exp(loss),
            "adjusted_ppl": safe_exp(nll / (num_original - 1)),
            "num_tokenized_tokens": len(tokens), "num_original_tokens": num_original,
            "seq_len": seq_len, "stride": stride}


def evaluate_tokens(scorer: Scorer, prefix: str, seq_len: int, stride: int, vocab_size: int) -> dict:
    from t5x_like.data import open_token_file

    tokens = open_token_file(prefix).tokens
    largest = int(tokens.max(initial=0))
    if largest >= vocab_size:
        raise ValueError(f"token file {prefix} holds id {largest} but the model's vocab_size is {vocab_size}; "
                         "it was made with another tokenizer. Re-run preprocess with the model's tokenizer.")
    nll = score_stream(scorer, tokens, seq_len, stride, "tokens")
    loss = nll / (len(tokens) - 1)
    return {"task": "tokens", "loss": loss, "ppl": safe_exp(loss), "num_tokens": len(tokens),
            "seq_len": seq_len, "stride": stride}


def safe_exp(x: float) -> float:
    return math.exp(x) if x < 700 else float("inf")


# ---------------------------------------------------------------- LAMBADA


def lambada_example(tokenizer, text: str, strict: bool) -> tuple[list[int], list[int]]:
    """(context ids, target ids). Strict: the target is " " + the last whitespace-separated word."""
    if not strict:
        ids = tokenizer.encode(text)
        return ids[:-1], ids[-1:]
    last_word = text.split()[-1]
    start = text.rfind(last_word)
    return tokenizer.encode(text[:start].strip()), tokenizer.encode(" " + last_word)


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
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


def evaluate_lambada(scorer: Scorer, tokenizer, path: str, seq_len: int, strict: bool) -> dict:
    examples = [lambada_example(tokenizer, text, strict) for text in read_lambada(path)]
    if not examples:
        raise ValueError(f"{path}: no examples (expected JSON lines with a 'text' field).")
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


# ---------------------------------------------------------------- CLI


def summary(result: dict) -> str:
    if result["task"] == "wikitext":
        return (f"WikiText  seq_len {result['seq_len']}, stride {result['stride']}: "
                f"{result['num_original_tokens']:,} original tokens, {result['num_tokenized_tokens']:,} tokenized\n"
                f"  loss {result['loss']:.4f} nats/token   ppl {result['ppl']:.3f}   "
                f"adjusted ppl (per original token) {result['adjusted_ppl']:.3f}")
    if result["task"] == "lambada":
        return (f"LAMBADA ({result['method']}): accuracy {result['accuracy']:.4f} "
                f"({result['num_correct']}/{result['num_examples']})   target ppl {result['ppl']:.3f}")
    return (f"tokens  {result['num_tokens']:,} tokens, seq_len {result['seq_len']}, stride {result['stride']}: "
            f"loss {result['loss']:.4f}   ppl {result['ppl']:.3f}")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=("wikitext", "lambada", "tokens"))
    parser.add_argument("--checkpoint", required=True, help="MODEL_DIR (latest step) or a step directory")
    parser.add_argument("--data", required=True, help="wikitext file, lambada .jsonl, or token-file prefix")
    parser.add_argument("--tokenizer", default=None, help="default: the tokenizer the checkpoint records")
    parser.add_argument("--seq_len", type=int, default=None, help="window length (default: the model's max_len)")
    parser.add_argument("--stride", type=int, default=None, help="new targets per window (default: seq_len)")
    parser.add_argument("--batch_size", type=int, default=8, help="windows per step (global)")
    parser.add_argument("--lambada_last_token", action="store_true",
                        help="LAMBADA: predict only the last BPE token instead of the whole last word")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    inference.add_mesh_flags(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    config, params, tokenizer, partitioner = inference.load_for_inference(args, with_tokenizer=args.task != "tokens")
    max_length = make_lm(config).max_length
    seq_len = args.seq_len or max_length
    if seq_len > max_length:
        raise ValueError(f"--seq_len={seq_len} exceeds the model's max_len {max_length}.")
    scorer = Scorer(config, params, partitioner, args.batch_size)
    if args.task == "wikitext":
        result = evaluate_wikitext(scorer, tokenizer, args.data, seq_len, args.stride or seq_len)
    elif args.task == "lambada":
        result = evaluate_lambada(scorer, tokenizer, args.data, seq_len, strict=not args.lambada_last_token)
    else:
        result = evaluate_tokens(scorer, args.data, seq_len, args.stride or seq_len, config.vocab_size)
    result.update(checkpoint=args.checkpoint, data=args.data, tokenizer=getattr(tokenizer, "path", None))
    return result


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    result = run(args)
    print(summary(result))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


if __name__ == "__main__":
    main()
