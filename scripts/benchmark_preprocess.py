"""Preprocessing throughput, whole processes side by side: a plain loop, ours, and Megatron-LM's own script.

    python scripts/benchmark_preprocess.py --corpus_mb=200 --workers=1,2 --trials=2 --megatron=/path/Megatron-LM

Each run is a separate process timed from start to exit (interpreter start, imports, worker start-up,
reading, tokenizing, writing), on the same JSON-lines file and the same GPT-2 BPE files:

- plain loop: this script's `--plain_loop` mode, what a user writes first — one process reads a line,
  `json.loads`, encodes it with a `tokenizers` byte-level BPE built from the two files, appends the
  end-of-document id and writes the ids as uint16 (it imports json, numpy and tokenizers only);
- ours: `python -m t5x_like.data.preprocess --workers=N` (appends the end-of-document id by default);
- Megatron: `python tools/preprocess_data.py --tokenizer-type GPT2BPETokenizer --vocab-file --merge-file
  --append-eod --workers N` from the checkout given by --megatron, started with this repository's
  scripts/megatron_shims on PYTHONPATH (see its sitecustomize.py: Megatron's Triton-kernel modules, which
  preprocessing never calls, become empty modules, and Python 3.11 gets 3.12's `typing.override`), and, as
  its working directory, a folder holding `gpt2/config.json` + `gpt2/tokenizer_config.json` (Megatron asks
  transformers' AutoTokenizer for "gpt2" plus the two files; offline, a local "gpt2" folder answers).

Runs are interleaved (every configuration once, then again) and the fastest of --trials counts; the load
average is printed before each run, and each row gives the CPU seconds (user + system) of the process and
the workers it waited for: on a shared machine they show the work done, whatever share of the cores it got. Outputs are checked: ours' ids equal the plain loop's, and ours'
.bin/.idx are byte-identical to Megatron's. The corpus (unless --corpus is given) is WikiText-103's articles
(test raw, test and validation tokenized: the train split is not on this machine) as {"text": ...} lines,
repeated to --corpus_mb megabytes. Prints a markdown table (for docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = (REPO / ".." / "shared" / "data").resolve()
SHIMS = REPO / "scripts" / "megatron_shims"
WIKITEXT = ("wt-raw/wiki.test.raw", "wt103-tokenized/wiki.test.tokens", "wt103-tokenized/wiki.valid.tokens")
BPE_PAIRS = (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt"), ("gpt2-vocab.json", "gpt2-merges.txt"))
# What the Hub's "gpt2" repository answers AutoTokenizer with, besides the vocabulary and merges Megatron passes.
GPT2_HUB_CONFIG = {"config.json": {"model_type": "gpt2"}, "tokenizer_config.json": {"model_max_length": 1024}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", help="A JSON-lines corpus ({'text': ...}); default: built from WikiText-103.")
    parser.add_argument("--corpus_mb", type=float, default=200.0, help="Size of the built corpus in megabytes.")
    parser.add_argument("--tokenizer", default=str(SHARED / "gpt2-bpe"),
                        help="A folder with GPT-2 BPE's two files (encoder.json + vocab.bpe or vocab.json + merges.txt).")
    parser.add_argument("--workers", default="1,2", help="Comma-separated worker counts for ours and Megatron.")
    parser.add_argument("--trials", type=int, default=2, help="Runs per configuration; the fastest counts.")
    parser.add_argument("--megatron", help="A Megatron-LM checkout (tools/preprocess_data.py); omitted: no Megatron rows.")
    parser.add_argument("--megatron_python", default=sys.executable, help="The Python that runs Megatron's script.")
    parser.add_argument("--work_dir", help="Where the corpus and outputs go (default: a temporary folder).")
    parser.add_argument("--timeout", type=float, default=3600.0, help="Seconds before a run is killed.")
    parser.add_argument("--plain_loop", nargs=2, metavar=("INPUT", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.workers = [int(w) for w in args.workers.split(",")]
    return args


def bpe_files(folder: str) -> tuple[str, str]:
    """(vocabulary, merges) of the GPT-2 BPE files in `folder`."""
    for vocab, merges in BPE_PAIRS:
        if os.path.isfile(os.path.join(folder, vocab)) and os.path.isfile(os.path.join(folder, merges)):
            return os.path.join(folder, vocab), os.path.join(folder, merges)
    sys.exit(f"--tokenizer={folder}: no GPT-2 BPE file pair ({', '.join('+'.join(p) for p in BPE_PAIRS)}) there")


def plain_loop(corpus: str, output: str, tokenizer_folder: str) -> None:
    """The baseline, run as its own process: one document at a time, nothing but json, numpy and tokenizers."""
    import numpy as np
    import tokenizers
    from tokenizers import models, pre_tokenizers

    vocab, merges = bpe_files(tokenizer_folder)
    tokenizer = tokenizers.Tokenizer(models.BPE.from_file(vocab, merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    eod = tokenizer.token_to_id("<|endoftext|>")
    with open(corpus, encoding="utf-8") as lines, open(output, "wb") as out:
        for line in lines:
            ids = tokenizer.encode(json.loads(line)["text"], add_special_tokens=False).ids
            ids.append(eod)
            out.write(np.array(ids, np.uint16).tobytes())


def build_corpus(path: str, megabytes: float) -> None:
    """WikiText-103's articles as {"text": ...} lines, repeated until the file holds `megabytes` MB."""
    from t5x_like.data import formats

    sources = [str(SHARED / "wikitext" / name) for name in WIKITEXT]
    lines = [json.dumps({"text": a}) + "\n" for a in formats.read_documents(sources, "wikitext") if a.strip()]
    target, size = megabytes * 1e6, 0
    with open(path + ".partial", "w", encoding="utf-8") as f:
        while size < target:
            for line in lines:
                f.write(line)
                size += len(line.encode())
                if size >= target:
                    break
    os.replace(path + ".partial", path)


def cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], log: str, timeout: float, **kwargs) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of `command` as a whole process: the CPU time (user + system) of it and of
    every process it waited for (its workers). Its process group is killed past `timeout`."""
    with open(log, "w") as out:
        cpu, start = cpu_seconds_of_children(), time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # Megatron waits forever when its writer process dies
            process.wait()
            code = f"killed after {timeout:.0f}s"
        seconds, cpu = time.perf_counter() - start, cpu_seconds_of_children() - cpu
    if code != 0:
        tail = Path(log).read_text(errors="replace")[-3000:]
        sys.exit(f"{' '.join(command)} failed ({code}); the end of {log}:\n{tail}")
    return seconds, cpu


def with_path(folder: str) -> str:
    """PYTHONPATH with `folder` first."""
    return os.pathsep.join([folder] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def megatron_cwd(work: str) -> str:
    folder = os.path.join(work, "megatron_cwd")
    os.makedirs(os.path.join(folder, "gpt2"), exist_ok=True)
    for name, content in GPT2_HUB_CONFIG.items():
        Path(folder, "gpt2", name).write_text(json.dumps(content))
    return folder


def commands(args: argparse.Namespace, corpus: str, work: str) -> dict[tuple[str, int], tuple[list[str], str, dict]]:
    """(tool, workers) -> (command, output .bin, Popen keywords)."""
    tokenizer = os.path.abspath(args.tokenizer)
    runs = {("plain loop", 1): ([sys.executable, os.path.abspath(__file__), "--plain_loop", corpus,
                                 os.path.join(work, "plain.bin"), f"--tokenizer={tokenizer}"],
                                os.path.join(work, "plain.bin"), {})}
    ours_env = dict(os.environ, PYTHONPATH=with_path(str(REPO)))  # `-m t5x_like...` from any directory
    for workers in args.workers:
        prefix = os.path.join(work, f"ours_{workers}")
        runs["ours", workers] = ([sys.executable, "-m", "t5x_like.data.preprocess", f"--input={corpus}",
                                  f"--output_prefix={prefix}", f"--tokenizer={tokenizer}",
                                  f"--workers={workers}"], prefix + ".bin", {"env": ours_env})
    if args.megatron:
        script = os.path.join(os.path.abspath(args.megatron), "tools", "preprocess_data.py")
        if not os.path.isfile(script):
            sys.exit(f"--megatron={args.megatron}: no tools/preprocess_data.py there; pass a Megatron-LM checkout")
        vocab, merges = bpe_files(tokenizer)
        env = dict(os.environ, PYTHONPATH=with_path(str(SHIMS)), HF_HUB_OFFLINE="1")
        cwd = megatron_cwd(work)
        for workers in args.workers:
            prefix = os.path.join(work, f"megatron_{workers}")
            runs["Megatron", workers] = ([args.megatron_python, script, "--input", corpus, "--output-prefix", prefix,
                                          "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
                                          "--merge-file", merges, "--append-eod", "--workers", str(workers)],
                                         prefix + "_text_document.bin", {"env": env, "cwd": cwd})
    return runs


def check_outputs(runs: dict) -> list[str]:
    """Ours' ids equal the plain loop's; ours' .bin/.idx equal Megatron's byte for byte. Lines to print."""
    plain = Path(runs["plain loop", 1][1]).read_bytes()
    notes = []
    for (tool, workers), (_, output, _) in runs.items():
        if tool == "ours":
            if Path(output).read_bytes() != plain:
                sys.exit(f"{output} holds other ids than the plain loop's {runs['plain loop', 1][1]}")
        if tool == "Megatron":
            ours = runs["ours", workers][1]
            for suffix in (".bin", ".idx"):
                mine, theirs = Path(ours[:-4] + suffix), Path(output[:-4] + suffix)
                if mine.read_bytes() != theirs.read_bytes():
                    sys.exit(f"{mine} and Megatron's {theirs} differ")
            notes.append(f"ours --workers={workers}: .bin and .idx byte-identical to Megatron's")
    notes.append("ours: the same ids as the plain loop")
    return notes


def table(runs: dict, best: dict, cpus: dict, loads: dict, megabytes: float) -> list[str]:
    """One row per configuration, its fastest run: wall time, throughput, ratios, CPU seconds, load."""
    tokens = os.path.getsize(runs["plain loop", 1][1]) // 2
    plain_rate = megabytes / best["plain loop", 1]
    lines = ["| run | workers | tokens | MB | seconds | MB/s | x plain | per worker x plain | ours / Megatron "
             "| CPU s | load (1 min) |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (tool, workers), seconds in best.items():
        rate = megabytes / seconds
        versus = ""
        if tool == "ours" and ("Megatron", workers) in best:
            versus = f"{best['Megatron', workers] / seconds:.2f}x"
        lines.append(f"| {tool} | {workers} | {tokens:,} | {megabytes:.1f} | {seconds:.1f} | {rate:.2f} "
                     f"| {rate / plain_rate:.2f}x | {rate / workers / plain_rate:.2f}x | {versus} "
                     f"| {cpus[tool, workers]:.1f} | {loads[tool, workers]:.1f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.plain_loop:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        plain_loop(*args.plain_loop, args.tokenizer)
        return
    bpe_files(args.tokenizer)
    with tempfile.TemporaryDirectory(prefix="benchmark_preprocess_") as tmp:
        work = os.path.abspath(args.work_dir or tmp)
        os.makedirs(work, exist_ok=True)
        corpus = args.corpus or os.path.join(work, f"wikitext103_{args.corpus_mb:g}MB.jsonl")
        if not args.corpus and not os.path.isfile(corpus):
            build_corpus(corpus, args.corpus_mb)
        corpus = os.path.abspath(corpus)
        megabytes = os.path.getsize(corpus) / 1e6
        print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
              f"corpus {corpus} ({megabytes:.1f} MB); tokenizer {args.tokenizer}; best of {args.trials} "
              "interleaved runs, whole processes", flush=True)
        runs = commands(args, corpus, work)
        best, cpus, loads = {}, {}, {}
        for trial in range(args.trials):
            for key, (command, _, kwargs) in runs.items():
                load = os.getloadavg()
                log = os.path.join(work, f"{key[0].replace(' ', '_')}_{key[1]}.log")
                seconds, cpu = timed(command, log, args.timeout, **kwargs)
                print(f"trial {trial + 1}: {key[0]} --workers={key[1]}: {seconds:.1f}s, {cpu:.1f} CPU s (load "
                      f"average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})", flush=True)
                if seconds < best.get(key, float("inf")):
                    best[key], cpus[key], loads[key] = seconds, cpu, load[0]
        notes = check_outputs(runs)
        print("\n" + "\n".join(table(runs, best, cpus, loads, megabytes)) + "\n")
        print("\n".join(notes))


if __name__ == "__main__":
    main()
