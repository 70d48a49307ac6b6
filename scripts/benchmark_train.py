"""Training throughput for a preset on a mesh: tokens/s, step time, TFLOP/s, MFU, memory.

    python scripts/benchmark_train.py --preset=gpt2_small --batch_size=16 --seq_len=1024 \
        --dtype=bfloat16 --attention=auto --cross_entropy=chunked --steps=20

Random tokens stand in for data (the loader is benchmarked by benchmark_data.py). Timing starts
after --warmup steps (compilation included there) and waits for the last step to finish. Peak
memory is the device allocator's peak where the backend reports one (GPU/TPU), else XLA's
compiled-memory estimate for the step (CPU).

--compare=torch first runs scripts/benchmark_torch.py (the nanoGPT-style PyTorch reference) with the
same preset, batch, length, dtype, steps and warm-up in a child process (so each framework has the
device to itself), then ours, and prints both rows and ours/torch ratios.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

import configs
import models
from partitioning import MeshShape
from t5x_like import lm, metrics, optim
from t5x_like.experiment import ExperimentSettings, build_experiment
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt2_small")
    p.add_argument("--overrides", default="{}", help="JSON dict of model config overrides")
    p.add_argument("--batch_size", type=int, default=8, help="global batch, in sequences")
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--attention", default="auto")
    p.add_argument("--cross_entropy", default="chunked", choices=list(lm.CROSS_ENTROPY))
    p.add_argument("--loss_chunk_size", type=int, default=256, help="positions per step of the chunked loss")
    p.add_argument("--remat", default="none")
    p.add_argument("--grad_accum", type=int, default=1)
    p.add_argument("--data", type=int, default=-1)
    p.add_argument("--fsdp", type=int, default=1)
    p.add_argument("--tensor", type=int, default=1)
    p.add_argument("--expert", type=int, default=1, help="mesh 'expert' size (a mixture of experts' experts)")
    p.add_argument("--rules", default="fsdp_tensor")
    p.add_argument("--profile_dir", help="write a jax.profiler trace of the timed steps here")
    p.add_argument("--compare", choices=["torch"], help="also run the PyTorch reference and print the ratio")
    p.add_argument("--json", help="also write the result row (rows, with --compare) to this file")
    return p.parse_args(argv)


def peak_memory_bytes(compiled) -> tuple[int | None, str]:
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return int(stats["peak_bytes_in_use"]), "allocator peak"
    analysis = compiled.memory_analysis()
    if analysis is None:
        return None, "unknown"
    total = analysis.argument_size_in_bytes + analysis.output_size_in_bytes + analysis.temp_size_in_bytes \
        - analysis.alias_size_in_bytes
    return int(total), "compiled estimate"


def model_values(args: argparse.Namespace) -> dict:
    """The model config's values: the preset, the run's choices, then --overrides."""
    values = dict(configs.get_model_config(args.preset).to_dict(), dtype=args.dtype, attention=args.attention,
                  remat_policy=args.remat, dropout_rate=0.0, attention_dropout_rate=0.0)
    values.update(json.loads(args.overrides))
    return values


def measure(args: argparse.Namespace, values: dict | None = None) -> dict:
    """Build, compile and time our train step (of the model config `values`, default model_values(args));
    returns the result row."""
    values = model_values(args) if values is None else values
    exp = build_experiment(ExperimentSettings(
        model=models.config_from_dict(values),
        mesh=MeshShape(data=args.data, fsdp=args.fsdp, tensor=args.tensor, expert=args.expert),
        rules=args.rules, optimizer=optim.OptimizerSettings(learning_rate=1e-4, warmup_steps=10),
        batch_size=args.batch_size, feature_lengths={"targets": args.seq_len}, grad_accum_steps=args.grad_accum,
        cross_entropy=args.cross_entropy, loss_chunk_size=args.loss_chunk_size), train_steps=1000)
    config, mesh, num_params = exp.config, exp.mesh, exp.num_params
    rng = np.random.default_rng(0)
    state = exp.init_state()
    with exp.partitioner.activate():
        tokens = rng.integers(0, config.vocab_size, (args.batch_size, args.seq_len + 1), dtype=np.int32)
        batch = exp.global_batch({DECODER_INPUT_TOKENS: tokens[:, :-1], DECODER_TARGET_TOKENS: tokens[:, 1:],
                                  DECODER_LOSS_WEIGHTS: np.ones((args.batch_size, args.seq_len), np.float32)})
        step_fn = exp.train_step
        compiled = step_fn.lower(state, batch).compile()
        state, out = step_fn(state, batch)
        first_loss = float(out["loss"])
        for _ in range(args.warmup - 1):
            state, out = step_fn(state, batch)
        jax.block_until_ready(out)
        with jax.profiler.trace(args.profile_dir) if args.profile_dir else contextlib.nullcontext():
            start = time.perf_counter()
            for _ in range(args.steps):
                state, out = step_fn(state, batch)
            jax.block_until_ready((state, out))
            step_time = (time.perf_counter() - start) / args.steps
    flops = exp.flops_per_step
    tflops = flops / step_time / jax.device_count() / 1e12
    peak = metrics.peak_tflops(jax.devices()[0].device_kind)
    memory, memory_kind = peak_memory_bytes(compiled)
    return {
        "framework": "jax", "jax": jax.__version__, "preset": args.preset, "num_params": num_params, "device": jax.devices()[0].device_kind,
        "devices": jax.device_count(), "mesh": dict(mesh.shape), "rules": args.rules, "dtype": args.dtype,
        "attention": args.attention, "cross_entropy": args.cross_entropy, "loss_chunk_size": args.loss_chunk_size,
        "matmul_dtype": config.matmul_dtype, "steps": args.steps, "remat": args.remat,
        "batch_size": args.batch_size, "seq_len": args.seq_len, "grad_accum": args.grad_accum,
        "step_time_s": step_time, "tokens_per_sec": args.batch_size * args.seq_len / step_time,
        "tflops_per_device": tflops, "mfu": tflops / peak if peak else None,
        "peak_memory_gib": memory / 2**30 if memory is not None else None, "memory_source": memory_kind,
        "first_loss": first_loss, "final_loss": float(out["loss"]),
    }


def torch_reference(args: argparse.Namespace) -> dict:
    """The PyTorch reference's row for the same run, from a child process."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "benchmark_torch.py")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "torch.json")
        subprocess.run([sys.executable, script, f"--preset={args.preset}", f"--overrides={args.overrides}",
                        f"--batch_size={args.batch_size}", f"--seq_len={args.seq_len}", f"--steps={args.steps}",
                        f"--warmup={max(args.warmup, 1)}", f"--dtype={args.dtype}", f"--json={path}"], check=True)
        with open(path) as f:
            return json.load(f)


def ratios(ours: dict, reference: dict) -> dict:
    """ours / reference for throughput (>1: ours faster) and peak memory (<1: ours smaller)."""
    divide = lambda a, b: a / b if a is not None and b else None  # noqa: E731
    return {"tokens_per_sec": divide(ours["tokens_per_sec"], reference["tokens_per_sec"]),
            "peak_memory": divide(ours["peak_memory_gib"], reference["peak_memory_gib"])}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    reference = torch_reference(args) if args.compare == "torch" else None  # before jax takes the device
    row = measure(args)
    result = row if reference is None else {"ours": row, "torch": reference, "ours_over_torch": ratios(row, reference)}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
