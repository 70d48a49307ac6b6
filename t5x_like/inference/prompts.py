"""Prompts in and completions out for `python -m t5x_like.generate`: --prompt and --prompts_file, the interactive
loop (--interactive, as CPM-Generate's and GPT2-Chinese's generate scripts run), the JSONL records and their
display (GPT2-Chinese's `==== SAMPLE n ====` headers when a prompt has several samples)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Iterator, TextIO

from t5x_like import checks
from t5x_like.errors import UserError

STOP = "stop"
"""Typed at the interactive prompt (or end of input): the loop ends."""


def read_prompts(args: argparse.Namespace) -> list[str]:
    """--prompt values, then --prompts_file (a .jsonl with 'prompt' fields, or one prompt per line)."""
    prompts = list(args.prompt or [])
    if args.prompts_file:
        checks.existing_file("--prompts_file", args.prompts_file)
        try:
            with open(args.prompts_file, encoding="utf-8") as f:
                lines = [line.rstrip("\n") for line in f if line.strip()]
        except UnicodeDecodeError as e:
            raise UserError(f"--prompts_file={args.prompts_file}: byte {e.start} is not UTF-8 (a binary file?); "
                            "give a UTF-8 text file.") from None
        if args.prompts_file.endswith(".jsonl"):
            lines = [jsonl_prompt(args.prompts_file, number, line) for number, line in enumerate(lines, 1)]
        prompts.extend(lines)
    if not prompts and not args.interactive:
        raise UserError("no prompts: pass --prompt=TEXT (repeatable) or --prompts_file=FILE, or type them with "
                        "--interactive.")
    return prompts


def jsonl_prompt(path: str, number: int, line: str) -> str:
    try:
        prompt = json.loads(line)["prompt"]
    except (ValueError, KeyError, TypeError):
        prompt = None
    if not isinstance(prompt, str):
        raise UserError(f"--prompts_file={path}: line {number} is not a JSON object with a string 'prompt' field "
                        "(a .jsonl file holds {\"prompt\": \"...\"} per line; any other name: one prompt per line).")
    return prompt


def typed_prompts(stdin: TextIO, stdout: TextIO) -> Iterator[str]:
    """Prompts typed one per line until `stop` or the end of input; an empty line asks again. A prompt holding a
    newline is typed as `\\n` (GPT2-Chinese's layout reads newlines as [SEP])."""
    while True:
        stdout.write(f"prompt ({STOP} to exit) >>> ")
        stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == STOP:
            stdout.write("\n")
            return
        if not line.strip():
            stdout.write("a prompt should not be empty\n")
            continue
        yield line.rstrip("\n").replace("\\n", "\n")


def records(prompts: list[str | list[int]], prompt_tokens: list[list[int]], generated: list[list[int]],
            decode: Callable[[list[int]], str], max_new_tokens: int, num_samples: int) -> list[dict]:
    """One JSON record per completion (`sample`, counted from 1, when a prompt has several); `prompt_tokens` are
    the prompt's ids as the tokenizer gave them, for users to check their tokenisation (a prompt given as ids:
    those ids, in `prompt` too)."""
    out = []
    for k, ids in enumerate(generated):
        record = {"prompt": prompts[k // num_samples], "prompt_tokens": list(map(int, prompt_tokens[k // num_samples])),
                  "completion": decode(ids), "tokens": ids,
                  "finish_reason": "length" if len(ids) == max_new_tokens else "eod"}
        if num_samples > 1:
            record["sample"] = k % num_samples + 1
        out.append(record)
    return out


def show(completions: list[dict], joint: str, stdout: TextIO = sys.stdout) -> None:
    """Completions for a person to read: the prompt and its continuation (`joint` between them: ' => ' for an
    encoder-decoder's target), a SAMPLE header before each of several."""
    for r in completions:
        if "sample" in r:
            stdout.write(f"{'=' * 40} SAMPLE {r['sample']} {'=' * 40}\n")
        stdout.write(f"{r['prompt']}{joint}{r['completion']}\n{'-' * 40}\n")
    stdout.flush()
