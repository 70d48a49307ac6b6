"""Memory levers, measured: bytes per device of one train step for model size x mesh x policy,
each row compiled ahead of time by `python -m t5x_like.compile` (no accelerator needed).

    python scripts/benchmark_memory.py --topology=cpu:8 --output_dir=runs/memory
    python scripts/benchmark_memory.py --topology=v5p:2x2x2 --gin_file=gpt2_medium.gin   # with libtpu

Prints a markdown table (GiB per device: train state in device memory, XLA's arguments,
temporaries, total, and the train state offloaded to host memory).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

GiB = 1 << 30
# name: gin bindings (mesh sizes for 8 devices, rule set, remat policy, pipeline).
ROWS = {
    "data parallel": dict(DATA_PARALLEL=8, RULES="'data_parallel'"),
    "ZeRO-1 (optimizer state over fsdp=8)": dict(DATA_PARALLEL=1, FSDP_PARALLEL=8, RULES="'zero1'"),
    "FSDP / ZeRO-3 (fsdp=8)": dict(DATA_PARALLEL=1, FSDP_PARALLEL=8, RULES="'fsdp'"),
    "FSDP=8, remat full": dict(DATA_PARALLEL=1, FSDP_PARALLEL=8, RULES="'fsdp'", remat="'full'"),
    "FSDP=8, remat save_dots": dict(DATA_PARALLEL=1, FSDP_PARALLEL=8, RULES="'fsdp'", remat="'save_dots'"),
    "FSDP=8, remat minimal": dict(DATA_PARALLEL=1, FSDP_PARALLEL=8, RULES="'fsdp'", remat="'minimal'"),
    "FSDP=8, remat minimal_offloaded (saved activations in host memory)": dict(
        DATA_PARALLEL=1, FSDP_PARALLEL=8, RULES="'fsdp'", remat="'minimal_offloaded'"),
    "data parallel, optimizer state offloaded to host": dict(
        DATA_PARALLEL=8, RULES="'data_parallel'", **{"build_experiment.offload_optimizer_state": True}),
    "FSDP=8, remat full, optimizer state offloaded to host": dict(
        DATA_PARALLEL=1, FSDP_PARALLEL=8, RULES="'fsdp'", remat="'full'", **{"build_experiment.offload_optimizer_state": True}),
    "FSDP=2 x tensor=4, remat full": dict(DATA_PARALLEL=1, FSDP_PARALLEL=2, TENSOR_PARALLEL=4,
                                          RULES="'fsdp_tensor'", remat="'full'"),
    "FSDP=2 x tensor=4 + sequence parallel, remat full": dict(DATA_PARALLEL=1, FSDP_PARALLEL=2, TENSOR_PARALLEL=4,
                                                              RULES="'fsdp_tensor_sequence'", remat="'full'"),
    "FSDP=2 x tensor=4, no remat": dict(DATA_PARALLEL=1, FSDP_PARALLEL=2, TENSOR_PARALLEL=4, RULES="'fsdp_tensor'"),
    "FSDP=2 x tensor=4 + sequence parallel, no remat": dict(DATA_PARALLEL=1, FSDP_PARALLEL=2, TENSOR_PARALLEL=4,
                                                            RULES="'fsdp_tensor_sequence'"),
    "pipeline=2 (GPipe, 4 microbatches) x FSDP=4, remat full": dict(
        DATA_PARALLEL=1, PIPELINE_PARALLEL=2, FSDP_PARALLEL=4, NUM_MICROBATCHES=4, RULES="'fsdp'", remat="'full'"),
}


def bindings(row: dict, batch_size: int, seq_len: int) -> list[str]:
    values = dict(row)
    remat = values.pop("remat", "'none'")
    flags = [f"--gin.{name}={value}" for name, value in values.items()]
    return [*flags, f"--gin.model_config.remat_policy={remat}", f"--gin.BATCH_SIZE={batch_size}",
            f"--gin.SEQ_LEN={seq_len}"]


def compile_row(name: str, row: dict, args) -> dict:
    output = os.path.join(args.output_dir, name.replace(" ", "_").replace("/", "-") + ".json")
    command = [sys.executable, "-m", "t5x_like.compile", f"--gin_file={args.gin_file}", f"--topology={args.topology}",
               *bindings(row, args.batch_size, args.seq_len), f"--output={output}"]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        return {"name": name, "error": done.stderr.strip().splitlines()[-1]}
    with open(output) as f:
        return {"name": name, **json.load(f)}


def table(reports: list[dict]) -> str:
    lines = ["| configuration | state GiB | arguments GiB | temporaries GiB | total GiB | host state GiB |",
             "|---|---|---|---|---|---|"]
    for r in reports:
        if "error" in r:
            lines.append(f"| {r['name']} | failed: {r['error']} | | | | |")
            continue
        cells = [r[k] / GiB for k in ("state_bytes_per_device", "argument_bytes_per_device", "temp_bytes_per_device",
                                      "total_bytes_per_device", "host_state_bytes_per_device")]
        lines.append(f"| {r['name']} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gin_file", default="gpt2_medium.gin")
    parser.add_argument("--topology", default="cpu:8", help="8 devices: cpu:8, v5p:2x2x2, v4:2x2x1, v5e:2x4")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--output_dir", default="runs/memory")
    parser.add_argument("--only", nargs="*", help="row names to run (default: all)")
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    reports = []
    for name, row in ROWS.items():
        if args.only and name not in args.only:
            continue
        reports.append(compile_row(name, row, args))
        print(f"done: {name}", file=sys.stderr, flush=True)
    first = next((r for r in reports if "error" not in r), None)
    if first:
        print(f"{args.gin_file} ({first['num_params'] / 1e6:.0f}M parameters, {first['dtype']}), batch "
              f"{args.batch_size} x {args.seq_len}, {args.topology} ({first['device_kind']})\n")
    print(table(reports))


if __name__ == "__main__":
    main()
