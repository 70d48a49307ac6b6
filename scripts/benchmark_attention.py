"""Benchmark causal attention implementations: TFLOP/s and compiled memory, forward and fwd+bwd.

    python scripts/benchmark_attention.py                       # GPU/TPU: T = 1024..8192, D = 64/128
    python scripts/benchmark_attention.py --lengths 256 --head-dims 64 --tokens 512 --hidden 256 \
        --dtype float32 --repeats 2                             # CPU: small, interpret mode

Implementations: 'xla', 'cudnn' (GPU), 'pallas' (models.kernels.flash_attention with the launch of its
tuning table; interpreted on CPU, so CPU numbers only show it runs and agrees), 'pallas-untuned' (the
same kernels with the default launch), 'auto' (what the model runs by default), and the
attention kernels shipped with jax as reference points: 'jax-pallas' (jax.experimental.pallas.ops:
gpu.attention.mha, Triton, on GPU; tpu.flash_attention on TPU) and 'jax-mgpu'
(gpu.attention_mgpu, Mosaic GPU for Hopper, run in float16, which it requires; its causal backward is
not implemented, so forward only), and tokamax's ('tokamax-mosaic', 'tokamax-triton') where tokamax is
installed (jax >= 0.11). Each shape uses batch = tokens // length and heads = hidden // head_dim.

FLOPs follow the FlashAttention papers: forward 4·B·H·T²·D, halved for causal; fwd+bwd 3.5× that
(the backward is 2.5 forwards' worth of matmuls). Memory is the compiled step's temporary buffer
size (XLA memory analysis), i.e. what the step needs beyond its inputs and outputs. Time is the
median over --repeats rounds of the mean of --calls back-to-back calls (one sync per round, so
dispatch overlaps the previous call). `max|Δ|` is the largest difference of the forward output
from 'xla' on the same inputs. --json writes every row (with device and versions) to a file.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from models.attention import dot_product_attention  # noqa: E402
from models.kernels.flash_attention import flash_attention  # noqa: E402
from models.kernels.flash_attention_tuning import Tuning  # noqa: E402

IMPLEMENTATIONS = ("xla", "cudnn", "pallas", "pallas-untuned", "auto", "jax-pallas", "jax-mgpu", "tokamax-mosaic",
                   "tokamax-triton")


def jax_shipped_pallas() -> Callable | None:
    """jax's own Pallas attention for this backend as f(q, k, v) over BTNH, or None."""
    backend = jax.default_backend()
    if backend == "gpu":
        from jax.experimental.pallas.ops.gpu import attention

        return lambda q, k, v: attention.mha(q, k, v, segment_ids=None, causal=True,
                                             sm_scale=q.shape[-1] ** -0.5)
    if backend == "tpu":
        from jax.experimental.pallas.ops.tpu import flash_attention

        def bhtd(q, k, v):
            swap = lambda x: jnp.swapaxes(x, 1, 2)
            return swap(flash_attention.flash_attention(swap(q), swap(k), swap(v), causal=True,
                                                        sm_scale=q.shape[-1] ** -0.5))

        return bhtd
    return None


def jax_shipped_mosaic_gpu() -> Callable | None:
    """jax's Mosaic GPU (Hopper) attention as f(q, k, v) over BTNH, causal, or None off GPU. It takes float16
    only (bfloat16 fails: "src had type bfloat16 and dst had type float16"), so inputs are cast to it."""
    if jax.default_backend() != "gpu":
        return None
    from jax.experimental.pallas.ops.gpu import attention_mgpu

    config = attention_mgpu.TuningConfig(block_q=64, block_kv=128, max_concurrent_steps=2, causal=True)
    half = lambda x: x.astype(jnp.float16)
    return lambda q, k, v: attention_mgpu.attention(half(q), half(k), half(v), config)


def tokamax_attention(implementation: str) -> Callable | None:
    """tokamax's attention ('mosaic': its Mosaic GPU Hopper kernels with their backward; 'triton') over BTNH,
    or None where tokamax is not installed or off GPU."""
    if jax.default_backend() != "gpu":
        return None
    if importlib.util.find_spec("tokamax") is None:
        return None
    try:
        import tokamax
    except Exception as error:  # installed, but a dependency is missing: say so in the row
        message = f"import tokamax failed: {type(error).__name__}: {error}"

        def broken(q, k, v):
            raise RuntimeError(message)
        return broken
    return lambda q, k, v: tokamax.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


def attention_fn(name: str) -> Callable | None:
    if name == "jax-pallas":
        return jax_shipped_pallas()
    if name == "jax-mgpu":
        return jax_shipped_mosaic_gpu()
    if name.startswith("tokamax-"):
        return tokamax_attention(name.removeprefix("tokamax-"))
    if name == "cudnn" and jax.default_backend() != "gpu":
        return None
    if name == "pallas-untuned":  # our kernels with the default launch, not the tuning table's
        return lambda q, k, v: flash_attention(q, k, v, causal=True, tuning=Tuning())
    return lambda q, k, v: dot_product_attention(q, k, v, causal=True, implementation=name)


def forward_and_backward(attention: Callable) -> Callable:
    def loss(q, k, v):
        return jnp.sum(attention(q, k, v).astype(jnp.float32))

    return jax.grad(loss, argnums=(0, 1, 2))


def attention_flops(batch: int, heads: int, length: int, head_dim: int, mode: str) -> float:
    forward = 4 * batch * heads * length * length * head_dim / 2
    return forward if mode == "fwd" else 3.5 * forward


def time_call(fn: Callable, args, repeats: int, calls: int) -> float:
    """Seconds per call: the median over `repeats` rounds of `calls` back-to-back calls, after a warm-up."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        outs = [fn(*args) for _ in range(calls)]
        jax.block_until_ready(outs)
        times.append((time.perf_counter() - start) / calls)
    return statistics.median(times)


def measure(name, mode, q, k, v, reference, repeats, calls, attention: Callable | None = None) -> dict:
    """One implementation's timing and memory (`attention` replaces the one `name` stands for)."""
    attention = attention or attention_fn(name)
    if attention is None:
        return {"note": f"n/a on {jax.default_backend()}"}
    fn = jax.jit(attention if mode == "fwd" else forward_and_backward(attention))
    try:
        compiled = fn.lower(q, k, v).compile()
        seconds = time_call(compiled, (q, k, v), repeats, calls)
    except Exception as error:  # a backend refusing a shape is a result, not a crash
        return {"note": f"error: {type(error).__name__}: {str(error).splitlines()[0][:80]}"}
    row = {"seconds": seconds, "temp_bytes": compiled.memory_analysis().temp_size_in_bytes}
    if mode == "fwd":
        row["max_diff"] = float(jnp.max(jnp.abs(compiled(q, k, v).astype(jnp.float32) - reference)))
    return row


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda s: [int(x) for x in s.split(",")]
    p.add_argument("--lengths", type=ints, default=[1024, 2048, 4096, 8192])
    p.add_argument("--head-dims", type=ints, default=[64, 128])
    p.add_argument("--tokens", type=int, default=16384, help="batch = tokens // length")
    p.add_argument("--hidden", type=int, default=2048, help="heads = hidden // head_dim")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--implementations", type=lambda s: s.split(","), default=list(IMPLEMENTATIONS))
    p.add_argument("--modes", type=lambda s: s.split(","), default=["fwd", "fwd+bwd"])
    p.add_argument("--repeats", type=int, default=5, help="timed rounds (median)")
    p.add_argument("--calls", type=int, default=10, help="back-to-back calls per round")
    p.add_argument("--json", help="write all rows to this file")
    args = p.parse_args(argv)
    unknown = set(args.implementations) - set(IMPLEMENTATIONS)
    if unknown:
        p.error(f"unknown --implementations {sorted(unknown)}; choose from {IMPLEMENTATIONS}")
    return args


def write_json(args: argparse.Namespace, device, rows: list[dict]) -> None:
    with open(args.json, "w") as f:
        json.dump({"device": device.device_kind, "platform": device.platform, "jax": jax.__version__,
                   "dtype": args.dtype, "tokens": args.tokens, "hidden": args.hidden, "rows": rows}, f, indent=1)


def main(argv=None) -> None:
    args = parse_args(argv)
    device = jax.devices()[0]
    print(f"# jax {jax.__version__}, {device.platform} ({device.device_kind}), dtype {args.dtype}, "
          f"causal, tokens {args.tokens}, hidden {args.hidden}", flush=True)
    header = f"{'impl':<11}{'mode':<9}{'T':>6}{'D':>5}{'B':>4}{'H':>4}{'ms':>11}{'TFLOP/s':>10}{'temp MiB':>10}{'max|Δ|':>10}"
    print(header)
    rows = []
    for head_dim in args.head_dims:
        for length in args.lengths:
            batch, heads = max(1, args.tokens // length), max(1, args.hidden // head_dim)
            keys = jax.random.split(jax.random.key(0), 3)
            q, k, v = (jax.random.normal(key, (batch, length, heads, head_dim), args.dtype) for key in keys)
            reference = jax.jit(attention_fn("xla"))(q, k, v).astype(jnp.float32)
            for mode in args.modes:
                for name in args.implementations:
                    row = measure(name, mode, q, k, v, reference, args.repeats, args.calls)
                    row.update(impl=name, mode=mode, length=length, head_dim=head_dim, batch=batch, heads=heads)
                    rows.append(row)
                    if args.json:  # rewritten after every row, so a time-out keeps what was measured
                        write_json(args, device, rows)
                    prefix = f"{name:<11}{mode:<9}{length:>6}{head_dim:>5}{batch:>4}{heads:>4}"
                    if "note" in row:
                        print(f"{prefix}  {row['note']}", flush=True)
                        continue
                    row["tflops"] = attention_flops(batch, heads, length, head_dim, mode) / row["seconds"] / 1e12
                    diff = f"{row['max_diff']:.1e}" if "max_diff" in row else "-"
                    print(f"{prefix}{row['seconds'] * 1e3:>11.3f}{row['tflops']:>10.1f}"
                          f"{row['temp_bytes'] / 2**20:>10.1f}{diff:>10}", flush=True)


if __name__ == "__main__":
    main()
