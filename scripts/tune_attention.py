"""Tune our flash-attention kernels per shape and write the table that they and 'auto' read.

    python scripts/tune_attention.py --json=$OUT/tune.json          # GPU: D 64/128, T 1k-8k, bf16, causal
    python scripts/tune_attention.py --smoke --table=/tmp/t.json --json=/tmp/rows.json   # CPU, interpreted

Per shape (batch = --tokens // T, heads = --hidden // D), in order of --shapes:
  1. each kernel alone (forward, dQ, dK/dV, and the fused backward that adds dQ atomically) over its
     candidate launches (blocks, Triton warps and stages):
     all compiled at once in a thread pool, then timed one by one (median of --repeats rounds of --calls
     calls); a candidate whose result differs from the default launch's by more than rounding is refused
     (that is a race or a bad tile, not a speed);
  2. the fastest correct launch of each kernel makes the shape's Tuning, with the fused backward where it
     beats dQ + dK/dV together;
  3. forward and forward+backward of every implementation at that shape: 'xla', 'cudnn' (GPU), 'pallas'
     with the default launch ('pallas-untuned') and tuned, and the reference kernels of scripts/
     benchmark_attention.py that this jax has ('jax-mgpu' Mosaic GPU, run in float16 as it requires;
     'tokamax-mosaic' and 'tokamax-triton' where tokamax is installed);
  4. the table entry: the Tuning and the fastest of the implementations 'auto' can run ('xla', 'cudnn',
     'pallas') forward+backward, with the milliseconds behind it.
--table (default models/kernels/flash_attention_tuning.json) is rewritten after every shape with the
entries of this run (shapes of other platforms/dtypes already in it are kept), --json with every row; a
shape that no longer fits in --budget_s is left out and listed.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models.kernels import flash_attention as fa  # noqa: E402
from models.kernels.flash_attention_tuning import TABLE_PATH, KernelTuning, Tuning  # noqa: E402
from scripts.benchmark_attention import attention_flops, measure, time_call  # noqa: E402

K = KernelTuning
CANDIDATES = {  # per kernel: the Triton FA2 tutorial's and FlashAttention-2's usual launches around our default
    "forward": [K(128, 128), K(128, 128, 4, 2), K(128, 128, 8, 3), K(128, 64, 4, 3), K(128, 64, 8, 3),
                K(128, 64, 4, 4), K(128, 32, 4, 4), K(64, 64, 4, 3), K(64, 128, 4, 3)],
    "dq": [K(128, 128), K(128, 64, 4, 3), K(128, 64, 8, 3), K(128, 32, 4, 4), K(128, 32, 8, 4),
           K(64, 64, 4, 3), K(64, 32, 4, 3), K(64, 128, 4, 2)],
    "dkv": [K(128, 128), K(64, 128, 4, 3), K(64, 128, 8, 3), K(32, 128, 4, 4), K(32, 128, 8, 4),
            K(64, 64, 4, 3), K(32, 64, 4, 3), K(128, 64, 4, 2)],  # block_k owned, block_q walked
}
CANDIDATES["fused"] = CANDIDATES["dkv"]  # the fused backward walks as dK/dV does, adding dQ atomically
SMOKE_CANDIDATES = {name: [K(32, 32), K(16, 32, 2, 1), K(32, 16)] for name in CANDIDATES}
AUTO_CAN_RUN = ("xla", "cudnn", "pallas")
REFERENCES = ("jax-mgpu", "tokamax-mosaic", "tokamax-triton")


@dataclasses.dataclass
class Shape:
    head_dim: int
    length: int
    batch: int
    heads: int
    dtype: str


def kernel_inputs(shape: Shape, seed: int = 0):
    """q, k, v, dO in [B, H, T, D] and the forward's out/lse/delta of the default launch."""
    keys = jax.random.split(jax.random.key(seed), 4)
    q, k, v, do = (jax.random.normal(key, (shape.batch, shape.heads, shape.length, shape.head_dim), shape.dtype)
                   for key in keys)
    cfgs = configs_for(shape, Tuning())
    out, lse = jax.jit(functools.partial(fa.forward, cfgs.forward))(q, k, v, None)
    delta = jnp.sum(out.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    return q, k, v, do, lse, delta


def configs_for(shape: Shape, tuning: Tuning, interpret: bool | None = None) -> fa.KernelConfigs:
    return fa.kernel_configs(tuning, q_len=shape.length, kv_len=shape.length, head_dim=shape.head_dim,
                             has_segments=False, causal=True, scale=shape.head_dim ** -0.5, group=1, window=None,
                             interpret=jax.default_backend() == "cpu" if interpret is None else interpret)


def kernel_fn(name: str, cfgs: fa.KernelConfigs):
    """The kernel alone as f(q, k, v, do, lse, delta) -> its outputs ('fused': dK, dV and dQ in one kernel)."""
    rows = lambda x: jnp.swapaxes(x, 2, 3)
    if name == "forward":
        return lambda q, k, v, do, lse, delta: fa.forward(cfgs.forward, q, k, v, None)[0]
    if name == "dq":
        return lambda q, k, v, do, lse, delta: fa.backward_dq(cfgs.dq, q, k, v, do, lse, delta, None)
    fused = name == "fused"
    return lambda q, k, v, do, lse, delta: fa.backward_dkv(cfgs.dkv, q, k, v, do, rows(lse), rows(delta), None,
                                                           fused=fused)


def default_result(name: str, shape: Shape, inputs):
    """What the default launch of the split kernels gives for `name`'s outputs."""
    run = lambda kernel: jax.jit(kernel_fn(kernel, configs_for(shape, Tuning())))(*inputs)
    return (*run("dkv"), run("dq")) if name == "fused" else run(name)


def compile_all(lowered: list, workers: int) -> list:
    """Compile every lowered function at once (XLA and Triton compile outside the GIL); an error is a result."""
    def one(item):
        try:
            return item.compile()
        except Exception as error:  # a launch the compiler refuses (shared memory, registers) is a row
            return error

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, lowered))


def max_error(got, want) -> float:
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    return max(float(jnp.max(jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)))) /
               max(float(jnp.max(jnp.abs(w.astype(jnp.float32)))), 1e-6) for g, w in zip(got, want))


def tune_kernel(name: str, shape: Shape, inputs, candidates, args) -> tuple[KernelTuning, list[dict]]:
    """The fastest correct launch of one kernel at one shape, and a row per candidate."""
    with_candidate = lambda c: dataclasses.replace(Tuning(), **{"dkv" if name == "fused" else name: c})
    fns = [jax.jit(kernel_fn(name, configs_for(shape, with_candidate(c)))) for c in candidates]
    compiled = compile_all([fn.lower(*inputs) for fn in fns], args.workers)
    want = default_result(name, shape, inputs)
    rows = []
    for candidate, executable in zip(candidates, compiled):
        row = {"kernel": name, "head_dim": shape.head_dim, "length": shape.length, "launch": candidate.short()}
        try:
            if isinstance(executable, Exception):
                raise executable
            row["error"] = max_error(executable(*inputs), want)
            row["ms"] = time_call(executable, inputs, args.repeats, args.calls) * 1e3
        except Exception as error:
            row["note"] = f"{type(error).__name__}: {str(error).splitlines()[0][:100]}"
        row["ok"] = "ms" in row and row["error"] <= args.tolerance
        rows.append(row)
        print(f"  {name:<8}{candidate.short():<22}" + (f"{row['ms']:>9.3f} ms  err {row['error']:.1e}"
              if "ms" in row else f"  {row['note']}"), flush=True)
    timed = [(row["ms"], c) for row, c in zip(rows, candidates) if row["ok"]]
    best = min(timed, key=lambda t: t[0]) if timed else (float("inf"), KernelTuning())
    return best, rows


def pick_tuning(best: dict[str, tuple[float, KernelTuning]]) -> Tuning:
    """The fastest launch per kernel, and the fused backward where it beats dQ + dK/dV together."""
    fused = best["fused"][0] < best["dq"][0] + best["dkv"][0]
    return Tuning(forward=best["forward"][1], dq=best["dq"][1], dkv=best["fused" if fused else "dkv"][1],
                  backward="fused" if fused else "split")


def compare(shape: Shape, tuning: Tuning, args) -> list[dict]:
    """Forward and forward+backward of every implementation at one shape (BTNH inputs)."""
    keys = jax.random.split(jax.random.key(1), 3)
    q, k, v = (jax.random.normal(key, (shape.batch, shape.length, shape.heads, shape.head_dim), shape.dtype)
               for key in keys)
    reference = jax.jit(lambda q, k, v: fa.flash_attention(q, k, v, tuning=Tuning()))(q, k, v).astype(jnp.float32)
    tuned = lambda q, k, v: fa.flash_attention(q, k, v, tuning=tuning)
    untuned = lambda q, k, v: fa.flash_attention(q, k, v, tuning=Tuning())
    rows = []
    for mode in ("fwd", "fwd+bwd"):
        for name in args.implementations:
            fn = {"pallas": tuned, "pallas-untuned": untuned}.get(name)
            row = measure(name, mode, q, k, v, reference, args.repeats, args.calls, attention=fn)
            row.update(impl=name, mode=mode, head_dim=shape.head_dim, length=shape.length, batch=shape.batch,
                       heads=shape.heads)
            if "seconds" in row:
                flops = attention_flops(shape.batch, shape.heads, shape.length, shape.head_dim, mode)
                row["tflops"] = flops / row["seconds"] / 1e12
            rows.append(row)
            print(f"  {mode:<8}{name:<16}" + (f"{row['seconds'] * 1e3:>9.3f} ms {row['tflops']:>7.1f} TFLOP/s"
                  if "seconds" in row else f"  {row['note']}"), flush=True)
    return rows


def table_entry(shape: Shape, tuning: Tuning, rows: list[dict]) -> dict:
    ms = {mode: {r["impl"]: r["seconds"] * 1e3 for r in rows if r["mode"] == mode and "seconds" in r}
          for mode in ("fwd", "fwd+bwd")}
    runnable = {name: t for name, t in ms["fwd+bwd"].items() if name in AUTO_CAN_RUN}
    return {"platform": jax.default_backend(), "device": jax.devices()[0].device_kind, "dtype": shape.dtype,
            "causal": True, "head_dim": shape.head_dim, "length": shape.length, "tuning": tuning.to_dict(),
            "fastest": min(runnable, key=runnable.get),
            "fwd_bwd_ms": {name: round(t, 4) for name, t in runnable.items()},
            "fwd_ms": {name: round(t, 4) for name, t in ms["fwd"].items() if name in AUTO_CAN_RUN}}


def write_table(path: str, entries: list[dict], source: dict) -> None:
    """This run's entries, plus the kept entries of other (platform, dtype) pairs already in the file."""
    kept = []
    if os.path.exists(path):
        with open(path) as f:
            mine = {(e["platform"], e["dtype"]) for e in entries}
            kept = [e for e in json.load(f)["entries"] if (e["platform"], e["dtype"]) not in mine]
    with open(path, "w") as f:
        json.dump({"source": source, "entries": kept + entries}, f, indent=1)
        f.write("\n")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shapes = lambda s: [tuple(int(x) for x in part.split(":")) for part in s.split(",")]
    p.add_argument("--shapes", type=shapes, default=None,
                   help="D:T,... in the order to tune (default: 64:2048,128:2048,64:8192,128:8192,64:1024,"
                        "128:1024,64:4096,128:4096)")
    p.add_argument("--tokens", type=int, default=16384, help="batch = tokens // T")
    p.add_argument("--hidden", type=int, default=2048, help="heads = hidden // D")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--implementations", type=lambda s: s.split(","), default=None,
                   help="compared per shape (default: xla, cudnn, pallas-untuned, pallas and the references)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--tolerance", type=float, default=0.02, help="largest error relative to max |result|")
    p.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1), help="parallel compiles")
    p.add_argument("--table", default=TABLE_PATH, help="the tuning table to write")
    p.add_argument("--json", help="every row (candidates and comparisons) to this file")
    p.add_argument("--budget_s", type=float, default=420.0, help="start no new shape after this many seconds")
    p.add_argument("--smoke", action="store_true", help="tiny shapes and candidates, float32 (runs on a CPU)")
    args = p.parse_args(argv)
    if args.smoke:
        args.shapes = args.shapes or [(32, 64)]
        args.tokens, args.hidden, args.dtype, args.repeats, args.calls = 128, 64, "float32", 1, 1
    args.shapes = args.shapes or [(64, 2048), (128, 2048), (64, 8192), (128, 8192), (64, 1024), (128, 1024),
                                  (64, 4096), (128, 4096)]
    args.implementations = args.implementations or ["xla", "cudnn", "pallas-untuned", "pallas", *REFERENCES]
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    start = time.monotonic()
    candidates = SMOKE_CANDIDATES if args.smoke else CANDIDATES
    source = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "command": " ".join(sys.argv),
              "date": time.strftime("%Y-%m-%d"), "dtype": args.dtype, "tokens": args.tokens, "hidden": args.hidden}
    entries, results = [], {"source": source, "kernels": [], "compare": [], "skipped": []}
    for head_dim, length in args.shapes:
        if time.monotonic() - start > args.budget_s:
            results["skipped"].append(f"D={head_dim} T={length}")
            continue
        shape = Shape(head_dim, length, max(1, args.tokens // length), max(1, args.hidden // head_dim), args.dtype)
        print(f"# D={head_dim} T={length} B={shape.batch} H={shape.heads} {args.dtype}", flush=True)
        inputs = kernel_inputs(shape)
        best = {}
        for name in ("forward", "dq", "dkv", "fused"):
            best[name], rows = tune_kernel(name, shape, inputs, candidates[name], args)
            results["kernels"] += rows
        tuning = pick_tuning(best)
        print(f"  tuned: {tuning.short()}", flush=True)
        rows = compare(shape, tuning, args)
        results["compare"] += rows
        entries.append(table_entry(shape, tuning, rows))
        write_table(args.table, entries, source)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({**results, "entries": entries}, f, indent=1)
    print(f"# wrote {len(entries)} entries to {args.table}; skipped: {results['skipped'] or 'none'}")


if __name__ == "__main__":
    main()
