"""`python -m t5x_like.compile --gin_file=quickstart.gin --topology=v5p:8x8x16 --output=report.json`.

Compiles one train step of a gin configuration ahead of time for a target mesh, without its
hardware, and reports what one device would hold: parameter count, argument (train state + batch),
temporary and total bytes per device, FLOPs per step and, where XLA estimates it, the step time.
Exits with an error naming the numbers when the state alone, or after compiling the whole step,
does not fit the device's memory.

Topologies: `v5p:8x8x16`, `v4:4x4x4`, `v5e:16x16`, `v6e:16x16`, ... (TPU, through libtpu's topology
descriptions: `pip install 'jax[tpu]'` on any machine); `cpu:N` (N simulated CPU devices); none =
this machine's devices. experiment.build_experiment assembles the state and the step, as for
`python -m t5x_like.train`, so what compiles here is what training runs.
"""
from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from typing import Any, Sequence

import jax
import numpy as np
from absl import flags
from jax.sharding import Mesh

from t5x_like import checks, metrics
from t5x_like.config import cli, frontend
from t5x_like.errors import UserError, exit_on_user_error, run_absl_app
from t5x_like.experiment import build_experiment
from t5x_like.run.settings import RunSettings

GiB = 1 << 30
# HBM per chip by jax device_kind; a chip's TensorCores shown as separate devices share it.
HBM_PER_CHIP = {"TPU v4": 32 * GiB, "TPU v5 lite": 16 * GiB, "TPU v5": 95 * GiB, "TPU v6 lite": 32 * GiB}
HOW_TO_FIT = ("Shard it over more devices (FSDP_PARALLEL, TENSOR_PARALLEL, PIPELINE_PARALLEL), keep activations "
              "smaller (RULES='fsdp_tensor_sequence', model_config.remat_policy='full', a smaller BATCH_SIZE or more "
              "GRAD_ACCUM_STEPS), or use chips with more memory.")
# Macros the train CLI requires that compiling does not use.
UNUSED_MACROS = ("MODEL_DIR = None", "DATA_PATH = None")

flags.DEFINE_string("topology", None, "Target: a TPU topology such as v5p:8x8x16, or cpu:N; default: this machine.")
flags.DEFINE_string("output", None, "Write the report (JSON) here.")
flags.DEFINE_integer("num_slices", 1, "TPU multi-slice: this many slices of --topology joined over DCN (set "
                     "DCN_* macros whose product is the slice count).")
flags.DEFINE_float("device_memory_gib", None, "Device memory to check against; default: the device's own.")
flags.adopt_module_key_flags(cli)  # --help lists --gin_file, --gin_bindings (--gin.NAME=VALUE), ...


class DoesNotFit(Exception):
    """The step needs more memory per device than the device has."""


def target_devices(topology: str | None, num_slices: int = 1) -> list:
    """The devices to compile for: a TPU topology's compile-only devices, N CPU devices, or local ones."""
    if topology is None:
        return jax.devices()
    platform, _, shape = topology.partition(":")
    if not re.fullmatch(r"cpu:[1-9]\d*|v\d+[a-z]*:\d+(x\d+)*", topology):
        raise UserError(f"--topology={topology}: expected cpu:N (N >= 1 simulated CPU devices) or a TPU "
                        "generation and chip grid such as v4:2x2x2, v5p:8x8x16, v5e:16x16, v6e:4x4.")
    if platform == "cpu":
        count = int(shape)
        jax.config.update("jax_num_cpu_devices", count)  # only before the CPU backend starts
        devices = jax.devices("cpu")
        if len(devices) < count:
            raise UserError(f"--topology={topology}: only {len(devices)} CPU devices exist in this process; "
                             f"start it with XLA_FLAGS=--xla_force_host_platform_device_count={count}.")
        return devices[:count]
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # compiling uses no chip: let compiles run side by side
    jax.config.update("jax_platforms", "cpu")  # eager work on the CPU; the TPU devices only compile
    try:
        slices = {"num_slices": num_slices} if num_slices > 1 else {}
        return list(topologies.get_topology_desc(topology, "tpu", **slices).devices)
    except RuntimeError as e:
        if "not installed" not in str(e):
            raise UserError(f"--topology={topology}: libtpu does not know it ({str(e).splitlines()[0]}); give a "
                            "TPU generation and chip grid such as v4:2x2x2, v5p:8x8x16, v5e:16x16.") from None
        raise UserError(f"--topology={topology} needs libtpu's topology descriptions, which are not installed; "
                         "pip install 'jax[tpu]' (it works on a CPU-only machine).") from e


def device_memory(devices: Sequence, override_gib: float | None) -> int | None:
    """Bytes of memory per device: the override, the TPU chip's HBM shared by its cores, or what the
    runtime reports; None when unknown (CPU)."""
    if override_gib is not None:
        return int(override_gib * GiB)
    kind = devices[0].device_kind
    if kind in HBM_PER_CHIP:
        cores = sum(1 for d in devices if d.coords == devices[0].coords)
        return HBM_PER_CHIP[kind] // cores
    stats = devices[0].memory_stats() if devices[0].platform != "cpu" else None
    return stats.get("bytes_limit") if stats else None


def mesh_for(devices: Sequence, settings: RunSettings) -> Mesh:
    """The mesh of the run's axis sizes, built over `devices`."""
    return settings.experiment.mesh.build(devices)


HOST_MEMORY_KINDS = ("pinned_host", "unpinned_host")


def bytes_per_device(abstract: Any, shardings: Any, *, host: bool = False) -> int:
    """Bytes the largest shard of each array takes on one device, summed over the arrays kept in
    device memory (or, with host=True, over those offloaded to host memory)."""
    def shard_bytes(a, s):
        if (s.memory_kind in HOST_MEMORY_KINDS) != host:
            return 0
        return math.prod(s.shard_shape(a.shape)) * np.dtype(a.dtype).itemsize
    return sum(jax.tree.leaves(jax.tree.map(shard_bytes, abstract, shardings)))


def compile_step(devices: Sequence, memory: int | None, settings: RunSettings) -> tuple[dict[str, Any],
                                                                                     jax.stages.Compiled]:
    """Compile one train step of the run `settings` describe for `devices`: (report, executable)."""
    exp = build_experiment(settings.experiment, train_steps=settings.loop.train_steps,
                           mesh=mesh_for(devices, settings))
    state = exp.sharded_abstract_state()
    state_bytes = bytes_per_device(state, exp.shardings)
    check_fits("the train state (parameters + optimizer state)", state_bytes, memory)
    start = time.perf_counter()
    with exp.partitioner.activate():
        compiled = compile_or_explain(exp.train_step, state, exp.abstract_batch())
    compile_seconds = time.perf_counter() - start
    config, step_config = exp.config, exp.step_config
    report = {
        "devices": len(devices), "device_kind": devices[0].device_kind, "mesh": dict(exp.mesh.shape),
        "rules": exp.partitioner.rules.name, "model": config.family, "model_summary": config.summary(),
        "dtype": config.dtype, "remat_policy": config.remat_policy,
        "batch_size": exp.batch_size, "feature_lengths": exp.lengths, "grad_accum_steps": step_config.grad_accum_steps,
        "num_params": exp.num_params, "state_bytes_per_device": state_bytes,
        "host_state_bytes_per_device": bytes_per_device(state, exp.shardings, host=True),
        **memory_report(compiled), **cost_report(compiled, len(devices)),
        "analytic_flops_per_step": exp.flops_per_step,
        "step_seconds_at_peak": step_seconds_at_peak(exp.flops_per_step, devices),
        "device_memory_bytes": memory, "compile_seconds": round(compile_seconds, 1),
    }
    report["fits"] = memory is None or report["total_bytes_per_device"] <= memory
    return report, compiled


def memory_report(compiled) -> dict[str, int]:
    """XLA's per-device buffer assignment: arguments, outputs (the new state mostly aliases the
    donated old one), temporaries, and their total live at once."""
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
    return {"argument_bytes_per_device": m.argument_size_in_bytes, "output_bytes_per_device": m.output_size_in_bytes,
            "alias_bytes_per_device": m.alias_size_in_bytes, "temp_bytes_per_device": m.temp_size_in_bytes,
            "generated_code_bytes": m.generated_code_size_in_bytes, "total_bytes_per_device": total,
            "host_argument_bytes_per_device": m.host_argument_size_in_bytes,
            "host_temp_bytes_per_device": m.host_temp_size_in_bytes}


def cost_report(compiled, num_devices: int) -> dict[str, float | None]:
    """XLA's cost analysis of the per-device program. It counts a loop body once, so with scanned
    layers its FLOPs undercount (analytic_flops_per_step is the model's count); its step-time
    estimate is reported only when positive (libtpu returns negative values when it has none)."""
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    flops = cost.get("flops")
    seconds = cost.get("optimal_seconds")
    return {"xla_flops_per_step": flops * num_devices if flops is not None else None,
            "estimated_step_seconds": seconds if seconds is not None and seconds > 0 else None}


def step_seconds_at_peak(flops: float, devices: Sequence) -> float | None:
    """The step time at the devices' dense bf16 peak (a lower bound; MFU = this / the real time)."""
    peak = metrics.peak_tflops(devices[0].device_kind)
    return flops / (len(devices) * peak * 1e12) if peak else None


def check_fits(what: str, needed: int, memory: int | None) -> None:
    if memory is not None and needed > memory:
        raise DoesNotFit(f"{what} needs {needed / GiB:.2f} GiB per device but a device has {memory / GiB:.2f} GiB. "
                         + HOW_TO_FIT)


def compile_or_explain(step, state, batch) -> jax.stages.Compiled:
    """Compile; when the compiler itself runs out of device memory (TPU), say so and how to fit."""
    try:
        return step.lower(state, batch).compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        raise DoesNotFit(f"XLA could not fit one train step: {str(e).splitlines()[0]} " + HOW_TO_FIT) from None


def summary(report: dict[str, Any]) -> str:
    """The report for reading: the run, then memory per device in GiB, FLOPs and times."""
    def gib(key: str) -> str:
        return "unknown" if report.get(key) is None else f"{report[key] / GiB:.2f} GiB"

    memory = report["device_memory_bytes"]
    host = report["host_state_bytes_per_device"]
    host_state = f" (+ {gib('host_state_bytes_per_device')} in host memory)" if host else ""
    verdict = "" if memory is None else ("  (fits)" if report["fits"] else "  (DOES NOT FIT)")
    lines = [
        f"{report['model_summary']}; {report['num_params']:,} parameters, remat {report['remat_policy']!r}",
        f"batch {report['batch_size']}, lengths {report['feature_lengths']}, {report['grad_accum_steps']} "
        "accumulation step(s)",
        f"{report['devices']} x {report['device_kind']} ({report['topology']}), mesh {report['mesh']}, "
        f"rules {report['rules']!r}",
        "per device:",
        f"  train state      {gib('state_bytes_per_device')}" + host_state,
        f"  arguments        {gib('argument_bytes_per_device')}  (train state + batch)",
        f"  temporaries      {gib('temp_bytes_per_device')}",
        f"  total            {gib('total_bytes_per_device')} of {gib('device_memory_bytes')}{verdict}",
        f"FLOPs per step     {report['analytic_flops_per_step']:.3e} (model count)",
    ]
    if report["step_seconds_at_peak"] is not None:
        lines.append(f"step at peak      {report['step_seconds_at_peak']:.3f} s (a lower bound; MFU = this / real)")
    if report["estimated_step_seconds"] is not None:
        lines.append(f"XLA's estimate    {report['estimated_step_seconds']:.3f} s per step")
    lines.append(f"compiled in       {report['compile_seconds']} s")
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    del argv
    f = flags.FLAGS
    cli.quiet_library_logs()
    if f.device_memory_gib is not None:
        checks.finite_float("--device_memory_gib", f.device_memory_gib, minimum=0.0, exclusive_minimum=True)
    if f.output:
        checks.output_file("--output", f.output)
    if f.num_slices < 1 or (f.num_slices > 1 and not (f.topology or "").startswith("v")):
        raise UserError(f"--num_slices={f.num_slices}: a positive count of TPU slices, with a TPU --topology.")
    devices = target_devices(f.topology, f.num_slices)
    settings = frontend.parse_gin(f.gin_file, [*UNUSED_MACROS, *f.gin_bindings], f.gin_search_paths)
    memory = device_memory(devices, f.device_memory_gib)
    try:
        report, _ = compile_step(devices, memory, settings)
    except DoesNotFit as e:
        sys.exit(f"does not fit: {e}")
    report["topology"] = (f"{f.num_slices} x {f.topology}" if f.num_slices > 1 else f.topology) or "local"
    print(summary(report))
    if f.output:
        with open(f.output, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")
        print(f"report (JSON, bytes): {f.output}")
    try:
        check_fits("one train step (state, batch and temporaries)", report["total_bytes_per_device"], memory)
    except DoesNotFit as e:
        sys.exit(f"does not fit: {e}")


if __name__ == "__main__":
    run_absl_app(exit_on_user_error(frontend.plain_user_errors(main)), flags_parser=cli.parse_flags)
