"""`python -m t5x_like.eval`: zero-shot evaluation of a checkpoint, the Megatron-LM way.

    python -m t5x_like.eval --task=wikitext --checkpoint=MODEL_DIR --data=wiki.test.tokens \
        --seq_len=1024 --stride=32 --output=wikitext.json
    python -m t5x_like.eval --task=lambada --checkpoint=MODEL_DIR --data=lambada_test.jsonl
    python -m t5x_like.eval --task=tokens --checkpoint=MODEL_DIR --data=PREFIX   # a token file
    python -m t5x_like.eval --task=tokens --checkpoint=MODEL_DIR --data=PREFIX --split=validation \
        --max_batches=50      # the validation documents training held out (the run's DATA_SPLIT), 50 batches
    python -m t5x_like.eval --task=seq2seq --checkpoint=T5_DIR --data=pairs.jsonl   # encoder-decoder

wikitext: read the whole file, count original tokens as len(text.strip().split(" ")), detokenize,
tokenize, then score overlapping windows of seq_len+1 tokens that start every `stride` tokens; the
first window scores all its seq_len targets, every later one only its last `stride` (so each
target is scored once, with at least seq_len-stride tokens of context). loss = Σnll / (tokens-1),
ppl = exp(loss), adjusted_ppl = exp(Σnll / (original tokens-1)) (the GPT-2 paper's word-level
number, comparable across tokenizers).
lambada: last-word accuracy; strict (default): the target is " " + last word and counts only if
every target token is the argmax; --lambada_last_token: only the last BPE token is predicted.
tokens: loss / ppl over a preprocessed token file (documents back to back, as stored); --split takes
only one split's documents under the run's DATA_SPLIT (or --data_split).
--max_batches / --max_examples score only the first windows (examples for LAMBADA, pairs for
seq2seq); a partial WikiText pass reports no adjusted ppl (it needs the whole text's word count).
seq2seq (encoder-decoder checkpoints): a JSONL of {"inputs", "targets"} pairs, each side tokenized
with EOS appended as in training (the inputs as the model's kind builds every decoded prompt); loss and
token accuracy (argmax) of the teacher-forced targets, and exact match of the greedily decoded output's
text with the target text.
classification (encoder-only checkpoints with a classification head): a JSONL / TSV of text, text_pair,
label (or BoolQ's question, passage, label) as OBJECTIVE='classification' reads it; accuracy, F1 for
two labels, and each example's prediction (in --output).

"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import re
import sys
from typing import Any, Callable, Iterable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from partitioning import Partitioner
from t5x_like import agreement, checkpoints, distributed, generate, inference, validate
from t5x_like.data import loader
from t5x_like.data.objectives import classification, mlm, seq2seq
from t5x_like.data.objectives.common import token_files_vocabulary
from t5x_like.errors import UserError, exit_on_user_error
from t5x_like.features import (DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_START_ID,
                               DECODER_TARGET_TOKENS, ENCODER_INPUT_TOKENS, ENCODER_SEGMENT_IDS)
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
                             disable=not distributed.is_primary()):
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


def evaluate_wikitext(scorer: Scorer, tokenizer, path: str, seq_len: int, stride: int,
                      max_windows: int | None = None) -> dict:
    text = read_text(path)
    num_original = count_original_tokens(text)
    tokens = np.asarray(tokenizer.encode(wikitext_detokenize(text)), np.int32)
    nll, scored = score_stream(scorer, tokens, seq_len, stride, "wikitext", max_windows)
    loss = nll / scored
    result = {"task": "wikitext", "loss": loss, "ppl": safe_exp(loss),
              "adjusted_ppl": safe_exp(nll / (num_original - 1)),
              "num_tokenized_tokens": len(tokens), "num_original_tokens": num_original,
              "seq_len": seq_len, "stride": stride}
    if scored < len(tokens) - 1:  # a partial pass has no word-level count to compare with
        result.update(adjusted_ppl=None, num_scored_tokens=scored)
    return result


def evaluate_tokens(scorer: Scorer, prefix: str, seq_len: int, stride: int, vocab_size: int, *,
                    split: str | None = None, data_split: str | None = None, max_windows: int | None = None) -> dict:
    """Loss over a token file's documents back to back: all of them, or one split of them under
    `data_split` (the training run's DATA_SPLIT), or its first `max_windows` windows."""
    from t5x_like.data import open_token_file

    file = open_token_file(prefix)
    tokens = file.tokens
    if split is not None:
        first, last = loader.split_documents(data_split, file.num_documents, split, prefix)
        tokens = tokens[file.offsets[first]:file.offsets[last]]
    largest = int(tokens.max(initial=0))
    if largest >= vocab_size:
        raise UserError(f"token file {prefix} holds id {largest} but the model's vocab_size is {vocab_size}; "
                        "it was made with another tokenizer. Re-run preprocess with the model's tokenizer.")
    nll, scored = score_stream(scorer, tokens, seq_len, stride, "tokens", max_windows)
    loss = nll / scored
    result = {"task": "tokens", "loss": loss, "ppl": safe_exp(loss), "num_tokens": len(tokens),
              "num_scored_tokens": scored, "seq_len": seq_len, "stride": stride}
    if split is not None:
        result.update(split=split, data_split=data_split)
    return result


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


def read_text(path: str) -> str:
    """The file's text; bytes that are not UTF-8 (a binary file) are a user error naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"--data={path}: byte {e.start} is not UTF-8 (a binary file?); give a UTF-8 text file "
                        "(a token file is --task=tokens with its prefix).") from None


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
                     max_examples: int | None = None) -> dict:
    examples = [lambada_example(tokenizer, text, strict) for text in read_lambada(path)[:max_examples]]
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


# ---------------------------------------------------------------- seq2seq pairs


def seq2seq_rows(examples: Sequence[tuple[list[int], list[int]]], inputs_len: int, targets_len: int) -> Rows:
    """Teacher-forced rows: encoder inputs (+ padding mask), targets shifted right from the start id."""
    rows = {ENCODER_INPUT_TOKENS: np.zeros((len(examples), inputs_len), np.int32),
            ENCODER_SEGMENT_IDS: np.zeros((len(examples), inputs_len), np.int32),
            INPUTS: np.zeros((len(examples), targets_len), np.int32),
            TARGETS: np.zeros((len(examples), targets_len), np.int32),
            WEIGHTS: np.zeros((len(examples), targets_len), np.float32)}
    for row, (inputs, targets) in enumerate(examples):
        rows[ENCODER_INPUT_TOKENS][row, :len(inputs)] = inputs
        rows[ENCODER_SEGMENT_IDS][row, :len(inputs)] = 1
        rows[INPUTS][row, :len(targets)] = [DECODER_START_ID] + targets[:-1]
        rows[TARGETS][row, :len(targets)] = targets
        rows[WEIGHTS][row, :len(targets)] = 1
    return rows


def evaluate_seq2seq(scorer: Scorer, generator_for: Callable[[int], generate.Generator], tokenizer,
                     path: str, max_examples: int | None = None) -> dict:
    pairs = seq2seq.read_pairs(path)[:max_examples]
    texts = [tokenizer.encode(i) for i, _ in pairs]
    targets = [tokenizer.encode(t) + [tokenizer.eod_id] for _, t in pairs]
    targets_len = max(map(len, targets))
    generator = generator_for(targets_len)
    examples = [(generator.lm.prompt_ids(i, tokenizer.eod_id), t) for i, t in zip(texts, targets)]  # as decoded
    inputs_len = max(len(i) for i, _ in examples)
    batches = (seq2seq_rows(examples[i:i + scorer.batch_size], inputs_len, targets_len)
               for i in range(0, len(examples), scorer.batch_size))
    scores = scorer.score(batches, -(-len(examples) // scorer.batch_size), "seq2seq")
    decoded = generator.generate(texts)
    exact = sum(tokenizer.decode(ids) == target for ids, (_, target) in zip(decoded, pairs))
    num_tokens = sum(len(t) for _, t in examples)
    loss = float(scores["nll"].sum()) / num_tokens
    return {"task": "seq2seq", "num_examples": len(pairs), "num_target_tokens": num_tokens, "loss": loss,
            "ppl": safe_exp(loss), "token_accuracy": float(scores["num_correct"].sum()) / num_tokens,
            "exact_match": exact / len(pairs)}


# ---------------------------------------------------------------- CLI


def summary(result: dict) -> str:
    if result["task"] == "wikitext":
        return (f"WikiText  seq_len {result['seq_len']}, stride {result['stride']}: "
                f"{result['num_original_tokens']:,} original tokens, {result['num_tokenized_tokens']:,} tokenized\n"
                f"  loss {result['loss']:.4f} nats/token   ppl {result['ppl']:.3f}   "
                + (f"adjusted ppl (per original token) {result['adjusted_ppl']:.3f}"
                   if result["adjusted_ppl"] is not None else
                   f"adjusted ppl n/a ({result['num_scored_tokens']:,} tokens scored: --max_batches/--max_examples)"))
    if result["task"] == "lambada":
        return (f"LAMBADA ({result['method']}): accuracy {result['accuracy']:.4f} "
                f"({result['num_correct']}/{result['num_examples']})   target ppl {result['ppl']:.3f}")
    if result["task"] == "classification":
        f1 = f"   F1 {result['f1']:.4f} (positive label {result['positive_label']!r})" if "f1" in result else ""
        return (f"classification  {result['num_examples']} examples: accuracy {result['accuracy']:.4f} "
                f"({result['num_correct']}/{result['num_examples']}){f1}")
    if result["task"] == "seq2seq":
        return (f"seq2seq  {result['num_examples']} pairs, {result['num_target_tokens']:,} target tokens: "
                f"loss {result['loss']:.4f}   token accuracy {result['token_accuracy']:.4f}   "
                f"exact match {result['exact_match']:.4f}")
    split = f" ({result['split']} split under DATA_SPLIT={result['data_split']!r})" if "split" in result else ""
    return (f"tokens{split}  {result['num_scored_tokens']:,} of {result['num_tokens']:,} tokens scored, "
            f"seq_len {result['seq_len']}, stride {result['stride']}: loss {result['loss']:.4f}   "
            f"ppl {result['ppl']:.3f}")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True, choices=("wikitext", "lambada", "tokens", "seq2seq", "classification"))
    parser.add_argument("--checkpoint", required=True, help="MODEL_DIR (latest step) or a step directory")
    parser.add_argument("--data", required=True,
                        help="wikitext file, lambada .jsonl, token-file prefix, or seq2seq .jsonl of pairs")
    parser.add_argument("--tokenizer", default=None, help="default: the tokenizer the checkpoint records")
    parser.add_argument("--seq_len", type=int, default=None, help="window length (default: the model's max_len)")
    parser.add_argument("--stride", type=int, default=None, help="new targets per window (default: seq_len)")
    parser.add_argument("--batch_size", type=int, default=8, help="windows per step (global)")
    parser.add_argument("--max_batches", type=int, default=None,
                        help="score only the first N batches (of --batch_size windows or examples)")
    parser.add_argument("--max_examples", type=int, default=None,
                        help="score only the first N windows (wikitext, tokens) or examples (lambada)")
    parser.add_argument("--split", default=None, choices=loader.SPLITS,
                        help="tokens: only this split of the file's documents, as training split them")
    parser.add_argument("--data_split", default=None,
                        help="with --split: train,validation,test ratios (default: the checkpoint's run's "
                             "DATA_SPLIT, read from MODEL_DIR/operative_config.gin or config.gin)")
    parser.add_argument("--lambada_last_token", action="store_true",
                        help="LAMBADA: predict only the last BPE token instead of the whole last word")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    inference.add_mesh_flags(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    check_arguments(args)
    if args.task == "tokens":
        check_token_file_tokenizer(args.data, args.tokenizer or inference.read_config(args.checkpoint)[1])
    config, params, tokenizer, partitioner = inference.load_for_inference(args, with_tokenizer=args.task != "tokens")
    if args.task == "classification":
        return classification_result(args, config, params, tokenizer, partitioner)
    lm = make_lm(config)
    scorer = Scorer(config, params, partitioner, args.batch_size)
    if (args.task == "seq2seq") != (lm.KIND == "encoder_decoder"):
        raise UserError(f"--task={args.task} does not fit {args.checkpoint}, a {lm.KIND} model: --task=seq2seq "
                        "scores encoder-decoder checkpoints, the other tasks decoder-only ones.")
    limit = row_limit(args.max_batches, args.max_examples, scorer.batch_size)
    if args.task == "seq2seq":
        generator_for = lambda steps: generate.Generator(  # noqa: E731
            config, params, partitioner, eod_id=tokenizer.eod_id, max_new_tokens=steps,
            settings=generate.Sampling(temperature=0.0), batch_size=args.batch_size)
        result = evaluate_seq2seq(scorer, generator_for, tokenizer, args.data, limit)
    else:
        seq_len = args.seq_len or lm.max_length
        if seq_len > lm.max_length:
            raise UserError(f"--seq_len={seq_len} exceeds the model's max_len {lm.max_length}.")
        if args.task == "wikitext":
            result = evaluate_wikitext(scorer, tokenizer, args.data, seq_len, args.stride or seq_len, limit)
        elif args.task == "lambada":
            result = evaluate_lambada(scorer, tokenizer, args.data, seq_len, not args.lambada_last_token, limit)
        else:
            data_split = (args.data_split or run_data_split(args.checkpoint)) if args.split else None
            result = evaluate_tokens(scorer, args.data, seq_len, args.stride or seq_len, config.vocab_size,
                                     split=args.split, data_split=data_split, max_windows=limit)
    result.update(checkpoint=args.checkpoint, data=args.data, tokenizer=getattr(tokenizer, "path", None))
    return result


# ---------------------------------------------------------------- classification (encoder-only checkpoints)


def classification_result(args: argparse.Namespace, config, params, tokenizer, partitioner: Partitioner) -> dict:
    """--task=classification: accuracy (and F1 for two labels) of the checkpoint's classification head on
    a JSONL / TSV of text, text_pair, label (labels named as the checkpoint's label list records them),
    with every prediction."""
    lm = make_lm(config)
    if lm.KIND != "encoder_only" or "classification" not in lm.objectives(config):
        raise UserError(f"--task=classification needs a checkpoint with a classification head; {args.checkpoint} "
                        f"is a {lm.KIND} model ({config.summary()}).")
    names = config.label_names()
    ids, gold, _ = classification.classification_examples(args.data, tokenizer, names, config.max_input_length())
    limit = row_limit(args.max_batches, args.max_examples, args.batch_size)
    ids, gold = ids[:limit], gold[:limit]
    predicted = classify(lm, params, partitioner, ids, args.batch_size, mlm.mlm_vocabulary(tokenizer).pad_id)
    result = {"task": "classification", **classification_metrics(gold, predicted, names),
              "predictions": [{"index": i, "prediction": names[p], "label": names[g]}
                              for i, (p, g) in enumerate(zip(predicted.tolist(), gold.tolist()))]}
    result.update(checkpoint=args.checkpoint, data=args.data, tokenizer=tokenizer.path)
    return result


def classify(lm: LanguageModel, params, partitioner: Partitioner, ids: list[tuple[np.ndarray, np.ndarray]],
             batch_size: int, pad_id: int) -> np.ndarray:
    """The predicted label index of each (token ids, token types) example, in batches of `batch_size` rows
    (rounded up to the data-parallel shards) as long as the longest example."""
    shards = partitioner.batch_shards
    rows_per_batch = -(-batch_size // shards) * shards
    rows = classification.ClassificationRows(ids, np.zeros(len(ids), np.int32), max(len(t) for t, _ in ids), pad_id)
    sharding = partitioner.batch_sharding()
    with partitioner.activate():
        predict = jax.jit(lambda p, b: lm.score(p, b)["predictions"], out_shardings=partitioner.replicated)
        predictions = []
        for start in range(0, len(rows), rows_per_batch):
            batch = [rows[i] for i in range(start, min(start + rows_per_batch, len(rows)))]
            arrays = {k: pad_rows(np.stack([row[k] for row in batch]), rows_per_batch) for k in batch[0]}
            out = jax.device_get(predict(params, {k: inference.global_array(v, sharding) for k, v in arrays.items()}))
            predictions.append(np.asarray(out[:len(batch)]))
    return np.concatenate(predictions)


def classification_metrics(gold: np.ndarray, predicted: np.ndarray, names: Sequence[str]) -> dict:
    """accuracy, and with two labels F1 of the second ('True', '1', ...) as the positive one."""
    correct = int((gold == predicted).sum())
    metrics = {"num_examples": len(gold), "num_correct": correct, "accuracy": correct / len(gold)}
    if len(names) == 2:
        true_positive = int(((predicted == 1) & (gold == 1)).sum())
        precision = true_positive / max(int((predicted == 1).sum()), 1)
        recall = true_positive / max(int((gold == 1).sum()), 1)
        metrics.update(positive_label=names[1],
                       f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    return metrics


def row_limit(max_batches: int | None, max_examples: int | None, batch_size: int) -> int | None:
    """The most windows / examples to score under --max_batches and --max_examples (None: all)."""
    limits = [n for n in (max_examples, None if max_batches is None else max_batches * batch_size) if n is not None]
    if any(n < 1 for n in limits):
        raise UserError(f"--max_batches={max_batches}, --max_examples={max_examples}: limits must be positive.")
    return min(limits) if limits else None


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse bad numbers, an unwritable --output, data of the wrong shape for the task, and flags that do
    not apply to it (before anything is loaded)."""
    for name in ("seq_len", "stride", "max_batches", "max_examples"):
        if getattr(args, name) is not None:
            validate.positive_int(f"--{name}", getattr(args, name))
    validate.positive_int("--batch_size", args.batch_size)
    inference.check_flags(args)
    if args.output:
        validate.output_file("--output", args.output)
    if args.split and args.task != "tokens":
        raise UserError(f"--split applies to --task=tokens (a token file split by DATA_SPLIT), not {args.task}.")
    if args.task == "tokens":
        if args.data.endswith((".bin", ".idx")):
            raise UserError(f"--data={args.data}: pass the token file's prefix, without {args.data[-4:]}.")
        if os.path.isfile(args.data) and not os.path.isfile(args.data + ".bin"):
            raise UserError(f"--data={args.data} is a text file; --task=tokens takes a token-file prefix "
                            "(PREFIX.bin/.idx from t5x_like.data.preprocess). Text: --task=wikitext or lambada.")
        return
    if not os.path.isfile(args.data):
        hint = "; it is a token file: use --task=tokens" if os.path.isfile(args.data + ".bin") else ""
        raise UserError(f"--data={args.data}: no such file{hint}.")
    first = first_line(args.data)
    if args.task == "wikitext" and first.startswith("{"):
        raise UserError(f"--data={args.data} holds JSON lines, not WikiText; --task=wikitext reads raw text such "
                        "as wiki.test.tokens (LAMBADA's .jsonl is --task=lambada).")
    if args.task == "lambada":
        try:
            json.loads(first)["text"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"--data={args.data}: --task=lambada reads JSON lines with a 'text' field "
                            f"(lambada_test.jsonl); its first line is {first[:60]!r}.") from None


def check_token_file_tokenizer(prefix: str, tokenizer: str | None) -> None:
    """A token file made with another tokenizer than the checkpoint's is refused, as training refuses it."""
    from t5x_like.data import open_token_file

    if tokenizer and os.path.exists(tokenizer.removeprefix("cpm:")):
        token_files_vocabulary([open_token_file(prefix)], tokenizer)


def first_line(path: str) -> str:
    """The file's first non-blank line, stripped ('' for an empty file)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        return next((line.strip() for line in f if line.strip()), "")


def run_data_split(checkpoint: str) -> str:
    """DATA_SPLIT of the run that wrote `checkpoint`, from its MODEL_DIR/operative_config.gin or config.gin."""
    directory, _ = checkpoints.locate(checkpoint)
    model_dir = os.path.dirname(directory)
    for name in ("operative_config.gin", "config.gin"):
        try:
            with open(os.path.join(model_dir, name)) as f:
                match = re.search(r"^DATA_SPLIT\s*=\s*(.+)$", f.read(), re.M)
        except FileNotFoundError:
            continue
        if match:
            return ast.literal_eval(match[1].strip())
    raise UserError(f"--split: {model_dir} has no operative_config.gin or config.gin recording DATA_SPLIT (not a "
                    "t5x_like.train run?); pass --data_split=TRAIN,VALIDATION,TEST as the run had it.")


@agreement.stop_together  # several processes: one failing stops all, naming it
def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    inference.join_cluster(args)
    result = run(args)
    if not distributed.is_primary():
        return result
    print(summary(result))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


if __name__ == "__main__":
    exit_on_user_error(main)()
