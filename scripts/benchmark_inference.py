"""Benchmarks eval and generate, ours against transformers on the same checkpoint (`convert to-hf` of ours), as
users run them: whole processes, start-up, loading and compilation included.

    python scripts/benchmark_inference.py                     # a random GPT-2, the builtin corpus's tokenizer, CPU
    python scripts/benchmark_inference.py --checkpoint=MODEL_DIR --wikitext=wiki.test.tokens --seq_len=1024

WikiText perplexity: ours is `python -m t5x_like.eval --task=wikitext` on the first --lines lines of --wikitext;
transformers' is this script's own child process (`--reference=wikitext`): it loads the converted directory with
AutoModelForCausalLM and AutoTokenizer and scores the same text (detokenized as ours detokenizes it, written for
it ahead of time) in the same windows (--seq_len, new targets every --stride) and batches (--batch_size), under
torch.inference_mode in float32. Rate: tokenized tokens / wall seconds of the process.
Greedy generation: ours is `python -m t5x_like.generate --temperature=0`; transformers' is `model.generate` with
do_sample=False (`--reference=generate`), both over the same --prompts prompts (the first --prompt_words words of
WikiText's paragraphs, one per line), left-padded batches of --batch_size, --max_new_tokens new tokens each. Rate:
prompts x max_new_tokens / wall seconds. Both sides' answers are compared (perplexity, generations that differ).
Each process runs --repeats times; the best counts. JAX's persistent compilation cache is switched off for ours
(a user's first run has none). Prints a markdown table (for docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext" / "wt103-tokenized" / "wiki.test.tokens"
TASKS = ("wikitext", "generate")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None, help="our MODEL_DIR (default: make a random GPT-2)")
    parser.add_argument("--layers", type=int, default=4, help="the random GPT-2's blocks")
    parser.add_argument("--width", type=int, default=256, help="the random GPT-2's width")
    parser.add_argument("--max_len", type=int, default=512, help="the random GPT-2's positions")
    parser.add_argument("--wikitext", default=str(WIKITEXT), help="WikiText-103's wiki.test.tokens (or raw)")
    parser.add_argument("--lines", type=int, default=0, help="score only the first N lines (0: the whole file)")
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--stride", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=16, help="windows or prompts per step, both sides")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--prompt_words", type=int, default=24)
    parser.add_argument("--max_new_tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1, help="runs of each process; the best counts")
    parser.add_argument("--only", default=",".join(TASKS), help="comma-separated: wikitext, generate")
    parser.add_argument("--out", default=None, help="also write the rows as JSON lines here")
    parser.add_argument("--reference", choices=TASKS, help=argparse.SUPPRESS)  # the transformers child process
    parser.add_argument("--hf_dir", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# ------------------------------------------------------------------ transformers' side (a child process)

def load_hf(hf_dir: str):
    import torch
    import transformers

    torch.set_grad_enabled(False)
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    return model, transformers.AutoTokenizer.from_pretrained(hf_dir)


def reference_wikitext(args: argparse.Namespace) -> dict:
    """Σ nll over the windows ours scores: window w holds tokens [w·stride, w·stride + seq_len] and scores all
    its targets (w = 0) or its last `stride` ones (t5x_like.eval.scoring.window_rows)."""
    import torch

    model, tokenizer = load_hf(args.hf_dir)
    ids = tokenizer(Path(args.input).read_text(encoding="utf-8"), add_special_tokens=False)["input_ids"]
    seq_len, stride = args.seq_len, args.stride
    windows = 1 + -(-max(len(ids) - 1 - seq_len, 0) // stride)
    total, scored = 0.0, 0
    for first in range(0, windows, args.batch_size):
        count = min(args.batch_size, windows - first)
        tokens = torch.zeros((count, seq_len + 1), dtype=torch.long)
        weights = torch.zeros((count, seq_len), dtype=torch.float64)
        for row, window in enumerate(range(first, first + count)):
            chunk = ids[window * stride:window * stride + seq_len + 1]
            tokens[row, :len(chunk)] = torch.tensor(chunk)
            weights[row, 0 if window == 0 else seq_len - stride:len(chunk) - 1] = 1.0
        with torch.inference_mode():
            logits = model(tokens[:, :-1]).logits
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2).double(), tokens[:, 1:], reduction="none")
        total += float((nll * weights).sum())
        scored += int(weights.sum())
    loss = total / scored
    return {"loss": loss, "ppl": math.exp(loss), "num_tokenized_tokens": len(ids)}


def reference_generate(args: argparse.Namespace) -> list[dict]:
    import torch

    model, tokenizer = load_hf(args.hf_dir)
    eod = model.config.eos_token_id
    tokenizer.padding_side, tokenizer.pad_token_id = "left", eod
    prompts = [line.rstrip("\n") for line in Path(args.input).read_text(encoding="utf-8").splitlines() if line]
    records = []
    for first in range(0, len(prompts), args.batch_size):
        batch = tokenizer(prompts[first:first + args.batch_size], return_tensors="pt", padding=True,
                          add_special_tokens=False)
        with torch.inference_mode():
            out = model.generate(**batch, do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=eod,
                                 eos_token_id=eod)
        for row in out[:, batch["input_ids"].shape[1]:].tolist():
            records.append({"tokens": row[:row.index(eod)] if eod in row else row})
    return records


# ------------------------------------------------------------------ the measurement

def timed_process(command: list[str], env: dict, repeats: int) -> float:
    """The best wall time of `repeats` runs of the command (each must succeed)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
        best = min(best, time.perf_counter() - start)
    return best


def write_inputs(args: argparse.Namespace, workdir: Path) -> None:
    """wiki.txt (ours reads it), wiki.detok.txt (the same, detokenized as ours does, for transformers) and
    prompts.txt (the first --prompt_words words of WikiText's first --prompts paragraphs)."""
    from t5x_like.eval.wikitext import wikitext_detokenize

    lines = Path(args.wikitext).read_text(encoding="utf-8").splitlines(keepends=True)
    text = "".join(lines[:args.lines] if args.lines else lines)
    (workdir / "wiki.txt").write_text(text, encoding="utf-8")
    (workdir / "wiki.detok.txt").write_text(wikitext_detokenize(text), encoding="utf-8")
    paragraphs = [line.split() for line in lines if len(line.split()) > args.prompt_words and "=" not in line[:3]]
    prompts = [wikitext_detokenize(" ".join(words[:args.prompt_words])) for words in paragraphs[:args.prompts]]
    (workdir / "prompts.txt").write_text("".join(p + "\n" for p in prompts), encoding="utf-8")


def commands(task: str, args: argparse.Namespace, checkpoint: str, workdir: Path) -> dict[str, tuple[list[str], Path]]:
    """{'ours': (the CLI, its output file), 'transformers': (this script's reference child, its output file)}."""
    if task == "wikitext":
        ours = ["-m", "t5x_like.eval", "--task=wikitext", f"--data={workdir / 'wiki.txt'}", f"--stride={args.stride}",
                f"--seq_len={args.seq_len}"]
        reference = [f"--input={workdir / 'wiki.detok.txt'}", f"--seq_len={args.seq_len}", f"--stride={args.stride}"]
    else:
        ours = ["-m", "t5x_like.generate", f"--prompts_file={workdir / 'prompts.txt'}", "--temperature=0",
                f"--max_new_tokens={args.max_new_tokens}"]
        reference = [f"--input={workdir / 'prompts.txt'}", f"--max_new_tokens={args.max_new_tokens}"]
    outputs = {name: workdir / f"{task}.{name}" for name in ("ours", "transformers")}
    return {"ours": ([sys.executable, *ours, f"--checkpoint={checkpoint}", f"--batch_size={args.batch_size}",
                      f"--output={outputs['ours']}"], outputs["ours"]),
            "transformers": ([sys.executable, __file__, f"--reference={task}", f"--hf_dir={workdir / 'hf'}", *reference,
                              f"--batch_size={args.batch_size}", f"--output={outputs['transformers']}"],
                             outputs["transformers"])}


def read_answers(task: str, path: Path):
    with open(path, encoding="utf-8") as f:
        return json.load(f) if task == "wikitext" else [json.loads(line) for line in f if line.strip()]


def measure_task(task: str, args: argparse.Namespace, checkpoint: str, workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    row, answers = {"task": task}, {}
    for name, (command, output) in commands(task, args, checkpoint, workdir).items():
        row[f"{name}_seconds"] = timed_process(command, env, args.repeats)
        answers[name] = read_answers(task, output)
    ours, theirs = answers["ours"], answers["transformers"]
    if task == "wikitext":
        work = ours["num_tokenized_tokens"]
        row.update(tokens=work, ours_ppl=ours["ppl"], transformers_ppl=theirs["ppl"],
                   same_tokens=ours["num_tokenized_tokens"] == theirs["num_tokenized_tokens"])
    else:
        work = len(ours) * args.max_new_tokens
        row.update(tokens=work, prompts=len(ours),
                   generations_differing=sum(a["tokens"] != b["tokens"] for a, b in zip(ours, theirs)))
    for name in ("ours", "transformers"):
        row[f"{name}_tokens_per_s"] = work / row[f"{name}_seconds"]
    row["ratio"] = row["ours_tokens_per_s"] / row["transformers_tokens_per_s"]
    return row


def measure(args: argparse.Namespace, workdir: Path) -> list[dict]:
    sys.path.insert(0, str(REPO))
    from scripts.benchmark_lm_eval import make_checkpoint
    from t5x_like.convert import hf

    checkpoint = args.checkpoint or make_checkpoint(workdir, args)
    hf.to_hf(checkpoint, str(workdir / "hf"))
    write_inputs(args, workdir)
    return [measure_task(task, args, checkpoint, workdir) for task in args.only.split(",")]


def table(rows: list[dict]) -> str:
    lines = ["| task | tokens | ours s | transformers s | ours tokens/s | transformers tokens/s | ours / transformers "
             "| agreement |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        if row["task"] == "wikitext":
            agreement = (f"ppl {row['ours_ppl']:.4f} vs {row['transformers_ppl']:.4f}, same tokenization "
                         f"{row['same_tokens']}")
            name = "WikiText perplexity"
        else:
            agreement = f"{row['generations_differing']} of {row['prompts']} generations differ"
            name = "greedy generation"
        lines.append(f"| {name} | {row['tokens']:,} | {row['ours_seconds']:.1f} | {row['transformers_seconds']:.1f} "
                     f"| {row['ours_tokens_per_s']:,.0f} | {row['transformers_tokens_per_s']:,.0f} | "
                     f"{row['ratio']:.2f} | {agreement} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.reference:
        result = reference_wikitext(args) if args.reference == "wikitext" else reference_generate(args)
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(json.dumps(result) if args.reference == "wikitext" else
                    "".join(json.dumps(r) + "\n" for r in result))
        return []
    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args, Path(tmp))
    import torch

    from scripts.benchmark_lm_eval import write_rows  # (it imports jax: not in the reference child)

    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {load:.1f}; torch {torch.__version__} "
          f"({torch.get_num_threads()} threads); batch size {args.batch_size}; best of {args.repeats}\n")
    print(table(rows))
    write_rows(args.out, rows, load)
    return rows


if __name__ == "__main__":
    main()
