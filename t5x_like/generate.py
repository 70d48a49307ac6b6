"""`python -m t5x_like.generate`: text generation with a KV cache, under jit, on any mesh.

    python -m t5x_like.generate --checkpoint=MODEL_DIR --prompt="hangzhou is a beautiful city" \
        --max_new_tokens=64 --temperature=0.8 --top_p=0.95 --seed=0 --output=out.jsonl

Prompts of different lengths share a batch: they are left-padded, padding is masked out of the
attention (segment id 0) and positions count from each row's first real token, so every row
decodes exactly as it would alone. A row stops at the tokenizer's end-of-document id or where the model's
targets end (LanguageModel.end_ids: CPM-2's <s_1>); the loop stops when every row has. Temperature 0 is greedy
decoding; --num_beams=N beam search (with --length_penalty). For an encoder-decoder checkpoint each prompt is the
encoder's input as in training (T5: EOS appended, as transformers' T5 tokenizer does; CPM-2: the ids alone), and
the completion is the decoded target text; the decoder starts from the config's start ids (T5: id 0; CPM-2:
<s>, <s_0>) and caches its own and the cross-attention keys/values (the encoder runs once). Each output line is a
JSON object with `prompt`, `prompt_tokens`, `completion`, `tokens` (the generated ids, without the end id) and
`finish_reason` ('eod' or 'length'), and `sample` (1, 2, ...) with --num_samples > 1.

As GPT2-Chinese's and CPM-Generate's users expect: --num_samples completions per prompt,
--repetition_penalty (transformers' definition), --interactive (type prompts, read completions), and
every default in --help.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
from typing import Callable, Sequence

import jax

from t5x_like import checks
from t5x_like.cluster import peers, processes
from t5x_like.errors import UserError, exit_on_user_error
from t5x_like.inference import loading, prompts
from t5x_like.inference.decoding import DEFAULTS, GenerationOptions, check_model_fits
from t5x_like.inference.model import LoadedModel


def generation_options(args: argparse.Namespace) -> GenerationOptions:
    """The decoding flags, checked (in flag names, with the fix)."""
    return GenerationOptions(**{field.name: getattr(args, field.name)
                                for field in dataclasses.fields(GenerationOptions)})


def check_arguments(args: argparse.Namespace) -> GenerationOptions:
    """Every number in range and --output writable, before anything is loaded: the decoding options."""
    options = generation_options(args)
    loading.check_flags(args)
    if args.output:
        checks.output_file("--output", args.output)
    return options


class DefaultsHelp(argparse.HelpFormatter):
    """--help shows each flag's default (unless its help says it already)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False or \
                action.default == argparse.SUPPRESS or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.generate", description=__doc__.split("\n\n")[0],
                                     formatter_class=DefaultsHelp)
    parser.add_argument("--checkpoint", required=True, help="MODEL_DIR (latest step) or a step directory")
    parser.add_argument("--tokenizer", default=None, help="default: the tokenizer the checkpoint records")
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    parser.add_argument("--prompts_file", default=None, help="one prompt per line, or .jsonl with 'prompt'")
    parser.add_argument("--interactive", action="store_true",
                        help="read prompts typed at the terminal, one per line ('stop' or end of input exits), and "
                             "print their completions as they come")
    parser.add_argument("--max_new_tokens", type=int, default=DEFAULTS.max_new_tokens,
                        help="new tokens per completion at most")
    parser.add_argument("--num_samples", type=int, default=DEFAULTS.num_samples,
                        help="completions per prompt (GPT2-Chinese's --nsamples), each its own sample")
    parser.add_argument("--temperature", type=float, default=DEFAULTS.temperature, help="0 = greedy")
    parser.add_argument("--top_k", type=int, default=DEFAULTS.top_k, help="keep the k most likely ids (0 = all)")
    parser.add_argument("--top_p", type=float, default=DEFAULTS.top_p, help="nucleus: smallest set with this much mass")
    parser.add_argument("--repetition_penalty", type=float, default=DEFAULTS.repetition_penalty,
                        help="divide (multiply, when negative) the logits of ids already in the text by this, as "
                             "transformers does; > 1 discourages repeats (1 = none)")
    parser.add_argument("--num_beams", type=int, default=DEFAULTS.num_beams,
                        help="beam search with this many beams (1 = greedy or sampling, as set above)")
    parser.add_argument("--length_penalty", type=float, default=DEFAULTS.length_penalty,
                        help="beam search: a finished beam scores sum(log p) / length ** length_penalty")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed")
    parser.add_argument("--batch_size", type=int, default=DEFAULTS.batch_size, help="prompts decoded together (global)")
    parser.add_argument("--output", default=None, help="JSONL file (default: JSONL on stdout)")
    loading.add_mesh_flags(parser)
    return parser.parse_args(argv)


@exit_on_user_error
@peers.stop_together  # several processes: one failing stops all, naming it
def main(argv: Sequence[str] | None = None) -> list[dict]:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    options = check_arguments(args)
    loading.join_cluster(args)
    if args.interactive and jax.process_count() > 1:
        raise UserError("--interactive reads one terminal: run it as one process (one host), or give --prompt / "
                        "--prompts_file.")
    texts = prompts.read_prompts(args)
    check_model_fits(loading.compute_config(args), options)  # before the parameters load
    model = LoadedModel.from_flags(args)

    def complete(batch: list[str], seed: int) -> list[dict]:
        return model.generate(batch, seed=seed, **dataclasses.asdict(options))

    joint = " => " if model.kind == "encoder_decoder" else ""  # a target, or a continuation
    if args.interactive:
        return interact(complete, texts, args, joint)
    records = complete(texts, args.seed)
    if processes.is_primary():
        write(records, args.output, joint)
    return records


def interact(complete: Callable[[list[str], int], list[dict]], given: list[str], args: argparse.Namespace,
             joint: str) -> list[dict]:
    """The prompts given first, then each typed prompt's completions, printed as they come (and appended to
    --output as JSONL); every prompt samples with its own seed (--seed, then the next ones)."""
    done: list[dict] = []
    typed = prompts.typed_prompts(sys.stdin, sys.stdout)
    for number, text in enumerate(itertools.chain(given, typed)):
        records = complete([text], args.seed + number)
        prompts.show(records, joint)
        done.extend(records)
        if args.output:
            with open(args.output, "a" if number else "w", encoding="utf-8") as f:
                f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return done


def write(records: list[dict], output: str | None, joint: str) -> None:
    """JSONL to --output (and the completions shown on the console), or JSONL on stdout."""
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if not output:
        sys.stdout.write(lines)
        return
    with open(output, "w", encoding="utf-8") as f:
        f.write(lines)
    prompts.show(records, joint)


if __name__ == "__main__":
    exit_on_user_error(main)()
