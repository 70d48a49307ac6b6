"""Benchmarks the data loader: training tokens/s per host process.

    python scripts/benchmark_data.py                       # WikiText test set x 20, GPT-2 BPE from ../shared/data
    python scripts/benchmark_data.py --input=corpus.jsonl --tokenizer=tok/
    python scripts/benchmark_data.py --token_file=PREFIX --batch_size=16 --seq_len=2048

`make_source` batches per second over a token file (--token_file, or one preprocessed here, untimed, from
--input or the default corpus), fixed-length windows and packed rows, after a warm-up. Prints a markdown
table (for docs/benchmarks.md). Preprocessing throughput is scripts/benchmark_preprocess.py's: whole
processes, a plain loop, ours and Megatron-LM's preprocess_data.py side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from t5x_like.data import SourceSettings, formats, make_source
from t5x_like.data.preprocess import preprocess
from t5x_like.features import DECODER_INPUT_TOKENS

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", help="A JSON-lines corpus ({'text': ...}); default: WikiText test x --repeat.")
    parser.add_argument("--repeat", type=int, default=20, help="Copies of WikiText in the default corpus.")
    parser.add_argument("--tokenizer", default=str(SHARED / "gpt2-bpe"))
    parser.add_argument("--workers", type=int, default=1, help="Preprocess workers making the token file.")
    parser.add_argument("--token_file", help="An existing token-file prefix: measure only the loader, over it.")
    parser.add_argument("--batch_size", type=int, default=16, help="Loader rows per host.")
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--loader_seconds", type=float, default=5.0, help="Time per loader measurement.")
    return parser.parse_args()


def default_corpus(path: str, repeat: int) -> None:
    """WikiText-103's test articles, `repeat` times, as JSON lines."""
    articles = list(formats.read_documents([str(SHARED / "wikitext" / "wt-raw" / "wiki.test.raw")], "wikitext"))
    with open(path, "w") as f:
        for _ in range(repeat):
            f.writelines(json.dumps({"text": a}) + "\n" for a in articles)


def loader_rate(prefix: str, packing: bool, batch_size: int, seq_len: int, seconds: float) -> float:
    """Training tokens (batch_size x seq_len per batch) per second from one host process's loader."""
    source = make_source("train", SourceSettings(data_path=prefix, packing=packing), batch_size=batch_size,
                         feature_lengths={"targets": seq_len}, seed=0, shard_index=0, shard_count=1)
    for _ in range(20):
        batch = next(source)
    shape = batch[DECODER_INPUT_TOKENS].shape
    assert shape == (batch_size, seq_len), f"the loader gave {shape} rows, not {batch_size} x {seq_len}"
    start, batches = time.perf_counter(), 0
    while time.perf_counter() - start < seconds:
        next(source)
        batches += 1
    return batches * batch_size * seq_len / (time.perf_counter() - start)


def loader_rows(prefix: str, args: argparse.Namespace) -> None:
    """The loader's table rows: fixed-length windows, then packed rows, over the token file at `prefix`."""
    for packing in (False, True):
        rate = loader_rate(prefix, packing, args.batch_size, args.seq_len, args.loader_seconds)
        print(f"| loader: {'packed' if packing else 'fixed-length'} {args.batch_size} x {args.seq_len}, "
              f"1 host process | {rate:,.0f} |")


def main() -> None:
    args = parse_args()
    if args.token_file:
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
              f"Python {platform.python_version()}; token file {args.token_file}\n")
        print("| measurement | tokens/s |\n| --- | ---: |")
        loader_rows(args.token_file, args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        corpus = args.input or os.path.join(tmp, "corpus.jsonl")
        if not args.input:
            default_corpus(corpus, args.repeat)
        summary = preprocess([corpus], os.path.join(tmp, "p"), args.tokenizer, workers=args.workers)
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}, "
              f"Python {platform.python_version()}; corpus {corpus} ({os.path.getsize(corpus) / 1e6:.1f} MB, "
              f"{summary['num_tokens']:,} tokens); tokenizer {args.tokenizer}\n")
        print("| measurement | tokens/s |\n| --- | ---: |")
        loader_rows(os.path.join(tmp, "p"), args)


if __name__ == "__main__":
    main()
