"""Benchmarks lm-eval requests per second: ours (`t5x_like.eval.harness.CheckpointLM`) against lm-eval's own Hugging
Face backend (`--model hf`) on the same checkpoint (`convert to-hf` of ours), same machine, same batch size.

    python scripts/benchmark_lm_eval.py                        # a tiny GPT-2, the builtin corpus, CPU
    python scripts/benchmark_lm_eval.py --checkpoint=MODEL_DIR --batch_size=32 --out=rows.jsonl

Without --checkpoint a small GPT-2 (random weights, --layers x --width, --max_len positions) is made with the
builtin corpus's tokenizer. The requests are built from the builtin corpus's documents, shaped like lm-eval's
common tasks: loglikelihood as HellaSwag (a context of ~--context_words words, 4 endings of ~--ending_words
words each), loglikelihood_rolling as WikiText (documents of ~--document_chars characters, in windows of the
model's length), generate_until as a short-answer task (greedy, --max_gen_toks new tokens, stop at a blank
line). Each backend answers each request set once to warm up (our compilation; torch's first calls), then
--repeats timed times; the best time counts. Both backends' answers are compared (largest log-likelihood
difference, generations that differ). Prints a markdown table (for docs/benchmarks.md).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

REQUEST_TYPES = ("loglikelihood", "loglikelihood_rolling", "generate_until")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default=None, help="our MODEL_DIR (default: make a small GPT-2)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--max_len", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=16, help="rows per step (ours) = batch_size (hf)")
    parser.add_argument("--contexts", type=int, default=64, help="loglikelihood contexts (x4 endings)")
    parser.add_argument("--context_words", type=int, default=60)
    parser.add_argument("--ending_words", type=int, default=12)
    parser.add_argument("--documents", type=int, default=16)
    parser.add_argument("--document_chars", type=int, default=6000)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max_gen_toks", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--only", default=",".join(REQUEST_TYPES), help="comma-separated request types")
    parser.add_argument("--out", default=None, help="also write the rows as JSON lines here")
    return parser.parse_args(argv)


def make_checkpoint(directory: Path, args: argparse.Namespace) -> str:
    """A random GPT-2 with the builtin corpus's tokenizer, as our checkpoint (imported with from-hf)."""
    import torch
    import transformers

    from t5x_like.convert import hf
    from t5x_like.data.builtin import builtin_corpus
    from t5x_like.data.tokenizer import load_tokenizer

    _, tokenizer_path = builtin_corpus()
    tokenizer = load_tokenizer(tokenizer_path)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tokenizer.vocab_size, n_positions=args.max_len, n_embd=args.width, n_layer=args.layers,
        n_head=max(args.width // 32, 1), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.eod_id, eos_token_id=tokenizer.eod_id))
    model.save_pretrained(directory / "random")
    shutil.copyfile(tokenizer_path, directory / "random" / "tokenizer.json")
    hf.from_hf(str(directory / "random"), str(directory / "ours"), scan_layers=False)
    return str(directory / "ours")


def words(document: str, first: int, count: int) -> str:
    return " ".join(document.split()[first:first + count])


def make_requests(args: argparse.Namespace) -> dict[str, list]:
    """Request sets of each type from the builtin corpus (documents long enough for them)."""
    from lm_eval.api.instance import Instance

    from t5x_like.data.builtin import builtin_documents

    documents = [d for d in builtin_documents() if len(d.split()) > args.context_words + 4 * args.ending_words]
    contexts = documents[:args.contexts]
    loglikelihood = [Instance("loglikelihood", {}, (words(doc, 0, args.context_words),
                                                    " " + words(documents[(i + k) % len(documents)],
                                                                args.context_words, args.ending_words)), k)
                     for i, doc in enumerate(contexts) for k in range(4)]
    long_documents = [d for d in builtin_documents() if len(d) > args.document_chars][:args.documents]
    rolling = [Instance("loglikelihood_rolling", {}, (d[:args.document_chars],), 0) for d in long_documents]
    settings = {"until": ["\n\n"], "max_gen_toks": args.max_gen_toks, "do_sample": False}
    generation = [Instance("generate_until", {}, (words(d, 0, 30), dict(settings)), 0)
                  for d in documents[-args.prompts:]]
    return {"loglikelihood": loglikelihood, "loglikelihood_rolling": rolling, "generate_until": generation}


def timed(lm, request_type: str, requests: list, repeats: int) -> tuple[list, float, float]:
    """(answers, first call s, best of `repeats` later calls s)."""
    start = time.perf_counter()
    answers = getattr(lm, request_type)(requests)
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        getattr(lm, request_type)(requests)
        best = min(best, time.perf_counter() - start)
    return answers, first, best


def difference(request_type: str, ours: list, theirs: list) -> dict:
    """How far our answers are from the hf backend's."""
    if request_type == "generate_until":
        return {"generations_differing": sum(a != b for a, b in zip(ours, theirs))}
    values = [(a[0], b[0]) if isinstance(a, tuple) else (a, b) for a, b in zip(ours, theirs)]
    row = {"max_abs_loglikelihood_difference": max(abs(a - b) for a, b in values)}
    if request_type == "loglikelihood":
        row["greedy_flags_differing"] = sum(a[1] != b[1] for a, b in zip(ours, theirs))
    return row


def backends(checkpoint: str, hf_dir: str, batch_size: int) -> dict:
    """{'ours': CheckpointLM on all local devices (data parallel), 'hf': lm-eval's HFLM on the CPU in fp32}."""
    from lm_eval.models.huggingface import HFLM

    from partitioning import Partitioner, make_mesh
    from t5x_like.eval.harness.model import CheckpointLM
    from t5x_like.inference import loading

    config, _ = loading.read_config(checkpoint)
    partitioner = Partitioner(make_mesh(data=-1), "fsdp_tensor")
    params = loading.restore_sharded(checkpoint, config, partitioner)
    tokenizer = loading.checkpoint_tokenizer(checkpoint, config)
    return {"ours": CheckpointLM(config, params, partitioner, tokenizer, batch_size=batch_size, name=checkpoint),
            "hf": HFLM(pretrained=hf_dir, batch_size=batch_size, device="cpu", dtype="float32")}


def measure(args: argparse.Namespace, workdir: Path) -> list[dict]:
    """One row per request type: requests/s of each backend, their ratio, and how far their answers differ."""
    from t5x_like.convert import hf

    checkpoint = args.checkpoint or make_checkpoint(workdir, args)
    hf.to_hf(checkpoint, str(workdir / "hf"))
    lms = backends(checkpoint, str(workdir / "hf"), args.batch_size)
    requests = make_requests(args)
    rows = []
    for request_type in args.only.split(","):
        row = {"request_type": request_type, "requests": len(requests[request_type]), "batch_size": args.batch_size}
        answers = {}
        for name, lm in lms.items():
            answers[name], first, best = timed(lm, request_type, requests[request_type], args.repeats)
            row.update({f"{name}_requests_per_s": len(requests[request_type]) / best, f"{name}_first_call_s": first})
        row["ratio"] = row["ours_requests_per_s"] / row["hf_requests_per_s"]
        rows.append(row | difference(request_type, answers["ours"], answers["hf"]))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| request type | requests | ours req/s | lm-eval hf req/s | ours / hf | ours first call s "
             "| hf first call s | agreement |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for row in rows:
        agreement = ", ".join(f"{k} {v:.2g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                              if k.startswith(("max_abs", "greedy", "generations")))
        lines.append(f"| {row['request_type']} | {row['requests']} | {row['ours_requests_per_s']:.1f} | "
                     f"{row['hf_requests_per_s']:.1f} | {row['ratio']:.2f} | {row['ours_first_call_s']:.1f} | "
                     f"{row['hf_first_call_s']:.1f} | {agreement} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        rows = measure(args, Path(tmp))
    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs ({jax.device_count()} jax devices, torch "
          f"{torch.get_num_threads()} threads), load average {load:.1f}; jax {jax.__version__}, torch "
          f"{torch.__version__}; batch size {args.batch_size}; best of {args.repeats}\n")
    print(table(rows))
    write_rows(args.out, rows, load)
    return rows


def write_rows(path: str | None, rows: list[dict], load: float) -> None:
    """The rows as JSON lines at `path` (when given), each with the load average it was measured at."""
    if path:
        with open(path, "w") as f:
            f.writelines(json.dumps(row | {"load_average": load}) + "\n" for row in rows)


if __name__ == "__main__":
    main()
