"""The GPU suite's reports (scripts/benchmark_gpu.py writes them): a profile's GPU time per step by kind of
kernel, and the markdown tables of training rows, FP8-against-bf16 losses and the attention sweep."""
from __future__ import annotations

import os
import json
from collections import defaultdict

# ----------------------------------------------------------------------------- profile summary


def category(name: str) -> str:
    """A coarse class of a GPU kernel / HLO op name, for the profile's breakdown."""
    lower = name.lower()
    rules = (("attention", ("fmha", "flash", "cudnn", "attention", "sdpa")),
             ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "matmul", "dot")),
             ("copy/transpose", ("copy", "transpose", "memcpy", "memset")),
             ("collective", ("nccl", "all-reduce", "all_reduce")))
    for label, needles in rules:
        if any(n in lower for n in needles):
            return label
    return "fusion/elementwise" if "fusion" in lower or "triton" in lower or "loop" in lower else "other"


def busy_union(intervals: list[tuple[int, int]]) -> int:
    """Total length of the union of [start, end) intervals."""
    total, current_start, current_end = 0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    return total + (current_end - current_start if current_end is not None else 0)


def summarise_trace(path: str, steps: int, step_time_s: float | None, top: int = 30) -> str:
    """GPU time per step by op (the 'XLA Ops' line) and by kernel (the stream lines), and how busy the GPU was."""
    from jax.profiler import ProfileData  # the driver imports jax only here, after the children ran

    data = ProfileData.from_file(path)
    gpu_planes = [p for p in data.planes if p.name.startswith("/device:GPU")]
    if not gpu_planes:
        return f"no GPU plane in {path}: planes {[p.name for p in data.planes]}\n"
    plane = gpu_planes[0]
    by_line: dict[str, dict[str, float]] = {}
    kernel_intervals = []
    for line in plane.lines:
        totals: dict[str, float] = defaultdict(float)
        for event in line.events:
            totals[event.name] += event.duration_ns
            if line.name.startswith("Stream"):
                kernel_intervals.append((event.start_ns, event.start_ns + event.duration_ns))
        by_line[line.name] = totals
    out = [f"trace {os.path.basename(path)}: {plane.name}, {steps} traced steps; lines: {sorted(by_line)}"]
    busy_ms = busy_union(kernel_intervals) / 1e6 / steps
    if step_time_s:
        out.append(f"GPU busy (union of kernels on all streams) {busy_ms:.2f} ms per step of {step_time_s * 1e3:.2f} ms "
                   f"wall ({100 * busy_ms / (step_time_s * 1e3):.0f}%; the rest is launch gaps / host stalls)")
    ops = by_line.get("XLA Ops") or {}
    kernels: dict[str, float] = defaultdict(float)
    for name, totals in by_line.items():
        if name.startswith("Stream"):
            for kernel, ns in totals.items():
                kernels[kernel] += ns
    for title, totals in (("XLA ops", ops), ("kernels", kernels)):
        if not totals:
            continue
        whole = sum(totals.values())
        out.append(f"\n## {title}: {whole / 1e6 / steps:.2f} ms per step in all")
        classes: dict[str, float] = defaultdict(float)
        for name, ns in totals.items():
            classes[category(name)] += ns
        out.append("by class: " + ", ".join(f"{c} {ns / 1e6 / steps:.2f} ms ({100 * ns / whole:.0f}%)"
                                             for c, ns in sorted(classes.items(), key=lambda kv: -kv[1])))
        out.append(f"{'ms/step':>9} {'%':>5}  name")
        for name, ns in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
            out.append(f"{ns / 1e6 / steps:>9.3f} {100 * ns / whole:>5.1f}  {name[:160]}")
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- markdown


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def train_table(rows: list[dict]) -> list[str]:
    lines = ["| run | tokens/s | step ms | TFLOP/s | MFU | peak GiB | ours/torch tokens/s | note |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    torch_by_batch = {(r.get("preset"), r.get("batch_size")): r for r in rows
                      if r.get("framework") == "torch" and "note" not in r}
    for r in rows:
        if "note" in r:
            lines.append(f"| {r['label']} | | | | | | | {r['note']} |")
            continue
        ratio = None
        ref = torch_by_batch.get((r.get("preset"), r.get("batch_size")))
        if r.get("framework") == "jax" and ref:
            ratio = r["tokens_per_sec"] / ref["tokens_per_sec"]
        note = ", ".join(f"{k}={r[k]}" for k in ("xla_flags",) if r.get(k))
        lines.append(f"| {r['label']} | {r['tokens_per_sec']:,.0f} | {r['step_time_s'] * 1e3:.1f} | "
                     f"{r['tflops_per_device']:.1f} | {fmt(r.get('mfu') and 100 * r['mfu'], '.1f')}% | "
                     f"{fmt(r.get('peak_memory_gib'), '.1f')} | {fmt(ratio, '.2f')} | {note} |")
    best = {}
    for r in rows:
        if "note" not in r and r.get("framework") in ("jax", "torch"):
            key = r["framework"]
            if key not in best or r["tokens_per_sec"] > best[key]["tokens_per_sec"]:
                best[key] = r
    if best:
        lines.append("")
        lines.append("Best: " + "; ".join(f"{k} {v['label']} at {v['tokens_per_sec']:,.0f} tokens/s" for k, v in best.items())
                     + (f"; ratio of bests {best['jax']['tokens_per_sec'] / best['torch']['tokens_per_sec']:.2f}"
                        if len(best) == 2 else ""))
    return lines


def loss_table(rows: list[dict]) -> list[str]:
    """First and final loss of each run (the fp8 item: the same batch every step, so the runs compare)."""
    lines = ["| run | steps | first loss | final loss |", "| --- | ---: | ---: | ---: |"]
    for r in rows:
        if "note" not in r:
            steps = r.get("steps")
            lines.append(f"| {r['label']} | {fmt(steps, 'd')} | {fmt(r.get('first_loss'), '.4f')} | "
                         f"{fmt(r.get('final_loss'), '.4f')} |")
    return lines


def attention_table(result: dict) -> list[str]:
    if "rows" not in result:
        return [f"attention benchmark failed: {result.get('note')}", "```", result.get("output", "")[-2000:], "```"]
    lines = [f"{result['device']}, jax {result['jax']}, {result['dtype']}, causal, {result['tokens']} tokens "
             f"(batch = tokens / T), {result['hidden']} hidden (heads = hidden / D). TFLOP/s (temp MiB):", ""]
    impls = list(dict.fromkeys(r["impl"] for r in result["rows"]))
    lines.append("| mode | T | D | " + " | ".join(impls) + " | best |")
    lines.append("| --- | ---: | ---: | " + " | ".join("---:" for _ in impls) + " | --- |")
    groups: dict = defaultdict(dict)
    for r in result["rows"]:
        groups[(r["mode"], r["length"], r["head_dim"])][r["impl"]] = r
    for (mode, length, head_dim), by_impl in groups.items():
        cells, timed = [], {}
        for impl in impls:
            r = by_impl.get(impl, {})
            if "tflops" in r:
                timed[impl] = r["tflops"]
                cells.append(f"{r['tflops']:.0f} ({r['temp_bytes'] / 2**20:.0f})")
            else:
                cells.append(r.get("note", "-")[:40])
        best = max((i for i in timed if i != "auto"), key=timed.get, default="-")
        lines.append(f"| {mode} | {length} | {head_dim} | " + " | ".join(cells) + f" | {best} |")
    return lines


def tune_table(tune: dict) -> list[str]:
    """Per tuned shape: each kernel's fastest launch, and the forward+backward milliseconds 'auto' chooses from."""
    lines = ["| D | T | forward | dQ | dK/dV | fwd+bwd ms | fastest |", "| ---: | ---: | --- | --- | --- | --- | --- |"]
    short = lambda k: f"{k['block_q']}x{k['block_k']} w{k['num_warps'] or 'auto'} s{k['num_stages']}"
    for e in tune["entries"]:
        ms = ", ".join(f"{name} {t:.3f}" for name, t in e["fwd_bwd_ms"].items())
        fused = e["tuning"].get("backward") == "fused"
        dq = "(fused into dK/dV)" if fused else short(e["tuning"]["dq"])
        dkv = short(e["tuning"]["dkv"]) + (" fused, adds dQ" if fused else "")
        lines.append(f"| {e['head_dim']} | {e['length']} | {short(e['tuning']['forward'])} | {dq} | {dkv} | {ms} "
                     f"| {e['fastest']} |")
    if tune.get("skipped"):
        lines += ["", f"Not tuned (out of time): {', '.join(tune['skipped'])}"]
    return lines


def markdown(results: dict) -> str:
    env = results["environment"]
    out = ["# GPU suite (scripts/benchmark_gpu.py)", "", f"Command: `{results.get('command')}`; ours: `{json.dumps(results.get('ours'))}`.", "",
           f"GPU: {env.get('nvidia-smi')}; jax {env.get('jax')} (jaxlib {env.get('jaxlib')}), flax {env.get('flax')}, "
           f"optax {env.get('optax')}, torch {env.get('torch')}, triton {env.get('triton')}.", ""]
    for item in ("small", "xl", "fp8", "flags", "dropout", "profile", "profile_xl", "moe"):
        rows = results["items"].get(item)
        if rows:
            devices = sorted({r["device"] for r in rows if "device" in r})
            out += [f"## {item} ({', '.join(devices)})", "", *train_table(rows), ""]
            if item == "fp8":
                out += [*loss_table(rows), ""]
    if "attention" in results:
        out += ["## attention", "", *attention_table(results["attention"]), ""]
    if "tune" in results:
        out += ["## attention kernels tuned (models/kernels/flash_attention_tuning.json)", "",
                *tune_table(results["tune"]), ""]
    for item in ("profile", "profile_xl"):
        if f"{item}_summary" in results:
            out += [f"## {item} (GPU time per step)", "", "```", results[f"{item}_summary"], "```", ""]
    for key in ("skipped", "errors"):
        if results.get(key):
            out += [f"## {key}", "", *(f"- {k}: {v}" for k, v in results[key].items()), ""]
    return "\n".join(out)
