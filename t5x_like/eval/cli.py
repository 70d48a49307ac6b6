"""`python -m t5x_like.eval`: zero-shot evaluation of a checkpoint, the Megatron-LM way.

    python -m t5x_like.eval --task=wikitext --checkpoint=MODEL_DIR --data=wiki.test.tokens \
        --seq_len=1024 --stride=32 --output=wikitext.json
    python -m t5x_like.eval --task=lambada --checkpoint=MODEL_DIR --data=lambada_test.jsonl
    python -m t5x_like.eval --task=tokens --checkpoint=MODEL_DIR --data=PREFIX   # a token file
    python -m t5x_like.eval --task=tokens --checkpoint=MODEL_DIR --data=PREFIX --split=validation \
        --max_batches=50      # the validation documents training held out (the run's DATA_SPLIT), 50 batches
    python -m t5x_like.eval --task=seq2seq --checkpoint=T5_DIR --data=pairs.jsonl   # encoder-decoder
    python -m t5x_like.eval --task=lm_eval --checkpoint=MODEL_DIR --lm_eval_tasks=hellaswag,arc_easy \
        [--lm_eval_include_path=DIR] [--num_fewshot=N] [--limit=N] --output=results.json

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
lm_eval (decoder-only checkpoints): lm-evaluation-harness tasks, groups or tags (t5x_like/eval/harness/); lm-eval's
summary table, and its results JSON in --output.
A tokenizer whose users get a beginning-of-text token before every text (one whose post-processor puts a BOS
such as <s> first; Tokenizer.bos_id) has it put first: before the WikiText stream (its first token is then scored
too, and adjusted ppl divides by all original tokens), before each LAMBADA context, and where lm-eval's hf
backend puts it for lm_eval; --no_bos scores the raw text (lm_eval: lm-eval's add_bos_token=False).

"""
from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from typing import Sequence

from t5x_like import checks
from t5x_like.checkpoint import store
from t5x_like.cluster import peers, processes
from t5x_like.data import loader
from t5x_like.data.objectives.common import token_files_vocabulary
from t5x_like.errors import UserError
from t5x_like.eval.classification import evaluate_classification
from t5x_like.eval.harness import cli as lm_eval_cli
from t5x_like.eval.lambada import evaluate_lambada
from t5x_like.eval.scoring import Scorer
from t5x_like.eval.seq2seq import evaluate_seq2seq
from t5x_like.eval.wikitext import evaluate_tokens, evaluate_wikitext
from t5x_like.inference import decoding, loading
from t5x_like.lm import make_lm


def summary(result: dict) -> str:
    if result["task"] == "wikitext":
        return (f"WikiText  seq_len {result['seq_len']}, stride {result['stride']}: "
                f"{result['num_original_tokens']:,} original tokens, {result['num_tokenized_tokens']:,} tokenized"
                f"{bos_note(result)}\n"
                f"  loss {result['loss']:.4f} nats/token   ppl {result['ppl']:.3f}   "
                + (f"adjusted ppl (per original token) {result['adjusted_ppl']:.3f}"
                   if result["adjusted_ppl"] is not None else
                   f"adjusted ppl n/a ({result['num_scored_tokens']:,} tokens scored: --max_batches/--max_examples)"))
    if result["task"] == "lambada":
        return (f"LAMBADA ({result['method']}): accuracy {result['accuracy']:.4f} "
                f"({result['num_correct']}/{result['num_examples']})   target ppl {result['ppl']:.3f}"
                f"{bos_note(result)}")
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


def bos_note(result: dict) -> str:
    """The summary's note that the text was scored after the tokenizer's beginning-of-text token ('' without)."""
    if result.get("bos_id") is None:
        return ""
    return f"; after BOS {result['bos_token']} (id {result['bos_id']}; --no_bos scores without it)"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", required=True,
                        choices=("wikitext", "lambada", "tokens", "seq2seq", "classification", "lm_eval"))
    parser.add_argument("--checkpoint", required=True, help="MODEL_DIR (latest step) or a step directory")
    parser.add_argument("--data", default=None, help="wikitext file, lambada .jsonl, token-file prefix, or seq2seq "
                                                      ".jsonl of pairs (every task but lm_eval)")
    parser.add_argument("--tokenizer", default=None, help="default: the tokenizer the checkpoint records")
    parser.add_argument("--seq_len", type=int, default=None, help="window length (default: the model's max_len)")
    parser.add_argument("--stride", type=int, default=None,
                        help="new targets per window (default: seq_len; lm_eval: the model's max_len)")
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
    parser.add_argument("--no_bos", action="store_true",
                        help="wikitext, lambada, lm_eval: score the text without the beginning-of-text token the "
                             "tokenizer puts first (a tokenizer whose post-processor puts a BOS such as <s> first; "
                             "byte-level BPEs mostly have none); lm_eval: lm-eval's add_bos_token=False")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    lm_eval_cli.add_arguments(parser)
    loading.add_mesh_flags(parser)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict:
    check_arguments(args)
    if args.task == "lm_eval":
        return lm_eval_cli.run(args)
    if args.task == "tokens":
        check_token_file_tokenizer(args.data, args.tokenizer or loading.read_config(args.checkpoint)[1])
    config, params, tokenizer, partitioner = loading.load_for_inference(args, with_tokenizer=args.task != "tokens")
    if args.task == "classification":
        limit = row_limit(args.max_batches, args.max_examples, args.batch_size)
        return evaluate_classification(config, params, tokenizer, partitioner, checkpoint=args.checkpoint,
                                       data=args.data, batch_size=args.batch_size, limit=limit)
    lm = make_lm(config)
    scorer = Scorer(config, params, partitioner, args.batch_size)
    if (args.task == "seq2seq") != (lm.KIND == "encoder_decoder"):
        raise UserError(f"--task={args.task} does not fit {args.checkpoint}, a {lm.KIND} model: --task=seq2seq "
                        "scores encoder-decoder checkpoints, the other tasks decoder-only ones.")
    limit = row_limit(args.max_batches, args.max_examples, scorer.batch_size)
    if args.task == "seq2seq":
        generator_for = lambda steps: decoding.Generator(  # noqa: E731
            config, params, partitioner, eod_id=tokenizer.eod_id, max_new_tokens=steps,
            settings=decoding.Sampling(temperature=0.0), batch_size=args.batch_size)
        result = evaluate_seq2seq(scorer, generator_for, tokenizer, args.data, limit)
    else:
        seq_len = args.seq_len or lm.max_length
        if seq_len > lm.max_length:
            raise UserError(f"--seq_len={seq_len} exceeds the model's max_len {lm.max_length}.")
        if args.task == "tokens":
            data_split = (args.data_split or run_data_split(args.checkpoint)) if args.split else None
            result = evaluate_tokens(scorer, args.data, seq_len, args.stride or seq_len, config.vocab_size,
                                     split=args.split, data_split=data_split, max_windows=limit)
        else:
            bos_id = None if args.no_bos else tokenizer.bos_id
            if args.task == "wikitext":
                result = evaluate_wikitext(scorer, tokenizer, args.data, seq_len, args.stride or seq_len, limit,
                                           bos_id)
            else:
                result = evaluate_lambada(scorer, tokenizer, args.data, seq_len, not args.lambada_last_token, limit,
                                          bos_id)
            result.update(bos_id=bos_id, bos_token=None if bos_id is None else tokenizer.id_to_token(bos_id))
    result.update(checkpoint=args.checkpoint, data=args.data, tokenizer=getattr(tokenizer, "path", None))
    return result


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
            checks.positive_int(f"--{name}", getattr(args, name))
    checks.positive_int("--batch_size", args.batch_size)
    loading.check_flags(args)
    if args.output:
        checks.output_file("--output", args.output)
    if args.split and args.task != "tokens":
        raise UserError(f"--split applies to --task=tokens (a token file split by DATA_SPLIT), not {args.task}.")
    if args.no_bos and args.task not in ("wikitext", "lambada", "lm_eval"):
        raise UserError(f"--no_bos applies to --task=wikitext, lambada and lm_eval (text scored by a decoder-only "
                        f"model), not {args.task}.")
    lm_eval_cli.check_flags_apply(args)
    if args.task == "lm_eval":
        return
    if args.data is None:
        raise UserError(f"--task={args.task} needs --data (the file or token-file prefix to score).")
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
    directory, _ = store.locate(checkpoint)
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


@peers.stop_together  # several processes: one failing stops all, naming it
def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    loading.join_cluster(args)
    result = run(args)
    if args.task == "lm_eval":
        lm_eval_cli.report(result, args.output)
    if args.task == "lm_eval" or not processes.is_primary():
        return result
    print(summary(result))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result
