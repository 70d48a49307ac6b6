"""The whole GPU suite in one invocation: GPT-2 ours vs PyTorch, attention kernels, a profile, XLA flags.

    python scripts/benchmark_gpu.py --out=results/           # on one GPU, ~9 minutes
    python scripts/benchmark_gpu.py --out=/tmp/smoke --smoke # tiny shapes, runs on a CPU

Writes under --out: results.md (the tables), results.json (every row), profile.txt (the 124M
step's top GPU kernels), profile_xl.txt (the same for 1.5B), step_hlo.txt (that step's optimized HLO, naming the fusions) and log.txt
(every child's output). Items, in order (--only picks some):

  small     GPT-2 124M, T=1024, bf16: ours (benchmark_train.py with the --ours settings) vs the
            PyTorch reference (benchmark_torch.py) at several batch sizes
  variants  ours at the first batch size with one setting changed (VARIANTS)
  profile   ours at the first batch size under jax.profiler: GPU time per kernel, per step
  xl        GPT-2 1.5B: every run of --xl_runs (framework:batch:remat; the PyTorch reference's
            torch.compile of 1.5B takes ~2.5 minutes, our unrolled 48 layers ~3.5)
  xl_profile  ours at 1.5B (the first jax run of --xl_runs) under jax.profiler, no HLO dump
  fp8       per --fp8_runs (124M B=16, 1.5B B=8): the PyTorch reference, ours bf16 and ours with FP8 matmuls
            (model_config.matmul_dtype='fp8'), each timed over --loss_steps (200) steps of the same batch:
            tokens/s and the final loss side by side
  tune      scripts/tune_attention.py: our attention kernels' launches tuned per shape (D 64/128, T 1k-8k),
            then every implementation beside them, causal fwd and fwd+bwd (xla, cudnn, ours untuned and
            tuned, Mosaic GPU);
            writes flash_attention_tuning.json (copy it to models/kernels/) and the attention table
  flags     ours at the first 124M batch size under --flags (FLAG_VARIANTS: XLA_FLAGS, FP8, loss chunk
            sizes; 'default' = none; 'a&b' = a and b together)
  dropout   ours at the first 124M batch size with dropout on: residual only (threefry, rbg PRNG)
            and residual + attention (which runs XLA attention)
  extra     both frameworks at the extra 124M batch sizes
  moe       scripts/benchmark_moe.py: a mixture of experts (GPT-2 124M's shape, 8 experts, top-2) against the
            dense model with the same active parameters, dropless and with capacity 1.25

--plan=headline is the prepared device check of issue 45 (small at the first batch size, xl, moe; about 10
minutes), and --headline=docs/gpu/headline.json writes the four figures README quotes
(scripts/benchmark_gpu_headline.py):

    python scripts/benchmark_gpu.py --out=results/ --plan=headline --headline=docs/gpu/headline.json

Every measurement runs in its own child process (one framework on the device at a time, allocator
peaks per run, XLA flags per process) with a time limit; a failure or time-out is a row with a
note, and the outputs are rewritten after every row, so one failure loses nothing else. Items that
no longer fit in --budget_s are skipped and listed as such.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from scripts import benchmark_gpu_headline as headline  # noqa: E402
from scripts.benchmark_gpu_report import markdown, summarise_trace  # noqa: E402

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
CACHE_DIR = os.path.join(tempfile.gettempdir(), "benchmark_gpu_jax_cache")  # the traced run reuses a compile
ITEMS = ("small", "variants", "profile", "xl_profile", "xl", "fp8", "tune", "flags", "dropout", "extra", "moe")
VARIANTS = {  # ours at the first 124M batch size with one setting changed from --ours
    "scan_layers=True": {"overrides": {"scan_layers": True}},
    "cross_entropy=full_logits": {"cross_entropy": "full_logits"},
    "cross_entropy=full_logits, scan_layers=True": {"cross_entropy": "full_logits", "overrides": {"scan_layers": True}},
}
FLAG_VARIANTS = {  # name -> XLA_FLAGS of the child ("xla_flags") and/or settings of ours, as VARIANTS
    "default": {},
    "latency hiding scheduler": {"xla_flags": "--xla_gpu_enable_latency_hiding_scheduler=true"},
    "command buffers off": {"xla_flags": "--xla_gpu_enable_command_buffer="},
    "triton gemm off": {"xla_flags": "--xla_gpu_enable_triton_gemm=false"},
    "latency hiding scheduler + triton gemm off":
        {"xla_flags": "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_enable_triton_gemm=false"},
    "cublaslt": {"xla_flags": "--xla_gpu_enable_cublaslt=true"},  # cuBLASLt GEMMs: bias + GELU epilogues fused
    "cudnn gemm fusions": {"xla_flags": "--xla_gpu_cudnn_gemm_fusion_level=2"},  # 0 (off) .. 3: GEMM fusions by cuDNN
    "cudnn layer norm": {"xla_flags": "--xla_gpu_enable_cudnn_layer_norm=true"},
    "fp8 matmuls": {"overrides": {"matmul_dtype": "fp8"}},  # the model knob, not an XLA flag (README, "FP8")
    "loss chunk 128": {"loss_chunk_size": 128},  # the chunked cross-entropy's positions per step (default 256)
    "loss chunk 512": {"loss_chunk_size": 512},
    "loss chunk 1024": {"loss_chunk_size": 1024},
}
"""`--flags` names these, or joins several with '&' into one row (their XLA flags and settings together),
e.g. 'cublaslt&cudnn layer norm&fp8 matmuls' for the best combination of the rows measured alone."""


@dataclasses.dataclass(frozen=True)
class Suite:
    """Shapes and step counts of one suite run (full on a GPU, tiny with --smoke)."""

    small: str
    small_batches: tuple[int, ...]
    extra_batches: tuple[int, ...]
    xl: str
    xl_runs: tuple[tuple[str, int, str], ...]  # (framework, batch, remat)
    flags: tuple[str, ...]  # FLAG_VARIANTS names, or names joined by '&'
    fp8_runs: tuple[tuple[str, int], ...]  # (preset, batch): torch, ours bf16 and ours fp8 for loss_steps steps
    loss_steps: int  # the fp8 item's timed steps, whose final loss it compares (the same batch every step)
    seq_len: int
    steps: int
    warmup: int
    tune_args: tuple[str, ...]  # scripts/tune_attention.py's, besides --table, --json and --budget_s
    torch_compile: bool


FULL = Suite(small="gpt2_small", small_batches=(16, 32), extra_batches=(64,), xl="gpt2_xl",
             xl_runs=(("jax", 8, "none"), ("torch", 8, "none"), ("jax", 12, "none"), ("jax", 16, "minimal")),
             flags=tuple(FLAG_VARIANTS), fp8_runs=(("gpt2_small", 16), ("gpt2_xl", 8)), loss_steps=200,
             seq_len=1024, steps=20, warmup=10,
             tune_args=(), torch_compile=True)
SMOKE = Suite(small="gpt2_tiny", small_batches=(2,), extra_batches=(4,), xl="gpt2_tiny",
              xl_runs=(("jax", 2, "minimal"), ("torch", 2, "none"), ("jax", 4, "full")),
              flags=("default", "latency hiding scheduler"), fp8_runs=(("gpt2_tiny", 2),), loss_steps=3,
              seq_len=64, steps=2, warmup=1,
              tune_args=("--smoke",), torch_compile=False)


class Recorder:
    """Collects rows per item and rewrites results.json / results.md after each one."""

    def __init__(self, out: str, suite: Suite, ours: dict):
        self.out, self.suite, self.ours = out, suite, ours
        self.results: dict = {"environment": environment(), "suite": dataclasses.asdict(suite), "ours": ours,
                              "command": " ".join(sys.argv), "items": {}}
        self.log = open(os.path.join(out, "log.txt"), "a")

    def add(self, item: str, row: dict) -> None:
        self.results["items"].setdefault(item, []).append(row)
        self.write()

    def write(self) -> None:
        with open(os.path.join(self.out, "results.json"), "w") as f:
            json.dump(self.results, f, indent=1)
        with open(os.path.join(self.out, "results.md"), "w") as f:
            f.write(markdown(self.results))


def environment() -> dict:
    """Versions and the GPU as nvidia-smi names it (no framework is imported here)."""
    env = {}
    for package in ("jax", "jaxlib", "flax", "optax", "torch", "triton"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = None
    try:
        env["nvidia-smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        env["nvidia-smi"] = None
    return env


def run_child(recorder: Recorder, argv: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str]:
    """Run a child (this interpreter), streaming its output to the console and log.txt; (rc, output)."""
    path = os.pathsep.join(filter(None, [os.path.dirname(SCRIPTS), os.environ.get("PYTHONPATH")]))
    merged = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=path, JAX_COMPILATION_CACHE_DIR=CACHE_DIR,
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", XLA_PYTHON_CLIENT_MEM_FRACTION="0.92",
                  **(env or {}))
    recorder.log.write(f"\n$ {' '.join(argv)}  (env {env or {}}, limit {timeout:.0f}s)\n")
    recorder.log.flush()
    lines = []
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=merged)
    deadline = time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            recorder.log.write(line)
            if time.monotonic() > deadline:
                proc.kill()
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = None
    if time.monotonic() > deadline:
        rc = None
    recorder.log.flush()
    return rc, "".join(lines)


def timed_row(recorder: Recorder, item: str, label: str, argv: list[str], json_path: str, timeout: float,
              env: dict | None = None) -> dict:
    """One child benchmark run that writes its row to json_path; the row (or a note) is recorded."""
    started = time.monotonic()
    rc, output = run_child(recorder, argv, timeout, env)
    if rc == 0 and os.path.exists(json_path):
        with open(json_path) as f:
            row = json.load(f)
    else:
        tail = [line for line in output.strip().splitlines() if line.strip()][-1:] or [""]
        row = {"note": "timed out" if rc is None else f"exit {rc}: {tail[0][:200]}"}
    row.update(label=label, wall_s=round(time.monotonic() - started, 1), xla_flags=(env or {}).get("XLA_FLAGS"))
    recorder.add(item, row)
    print(f"[{item}] {label}: " + (row.get("note") or f"{row['tokens_per_sec']:.0f} tokens/s, "
                                   f"step {row['step_time_s'] * 1e3:.1f} ms, MFU {row.get('mfu')}"), flush=True)
    return row


def ours_argv(recorder, suite, path, *, preset, batch, remat="none", steps=None, **settings) -> list[str]:
    """benchmark_train.py's command line: recorder.ours's settings (attention, cross_entropy, loss_chunk_size,
    overrides), then these."""
    merged = {**recorder.ours, **settings,
              "overrides": {**recorder.ours.get("overrides", {}), **settings.get("overrides", {})}}
    argv = [os.path.join(SCRIPTS, "benchmark_train.py"), f"--preset={preset}", f"--batch_size={batch}",
            f"--seq_len={suite.seq_len}", f"--steps={steps or suite.steps}", f"--warmup={suite.warmup}",
            f"--attention={merged.get('attention', 'auto')}", f"--cross_entropy={merged.get('cross_entropy', 'chunked')}",
            f"--remat={remat}", f"--overrides={json.dumps(merged['overrides'])}", f"--json={path}"]
    if "loss_chunk_size" in merged:
        argv.append(f"--loss_chunk_size={merged['loss_chunk_size']}")
    return argv


def ours(recorder, item, label, suite, tmp, timeout, *, preset, batch, remat="none", env=None, profile_dir=None,
         steps=None, **settings) -> dict:
    """benchmark_train.py with recorder.ours's settings, then these (ours_argv)."""
    path = os.path.join(tmp, f"{item}_{len(recorder.results['items'].get(item, []))}.json")
    argv = ours_argv(recorder, suite, path, preset=preset, batch=batch, remat=remat, steps=steps, **settings)
    if profile_dir:
        argv.append(f"--profile_dir={profile_dir}")
    return timed_row(recorder, item, label, argv, path, timeout, env)


def reference(recorder, item, label, suite, tmp, timeout, *, preset, batch, steps=None) -> dict:
    path = os.path.join(tmp, f"{item}_torch_{preset}_{batch}.json")
    argv = [os.path.join(SCRIPTS, "benchmark_torch.py"), f"--preset={preset}", f"--batch_size={batch}",
            f"--seq_len={suite.seq_len}", f"--steps={steps or suite.steps}", f"--warmup={suite.warmup}",
            f"--json={path}"]
    if not suite.torch_compile:
        argv.append("--no_compile")
    return timed_row(recorder, item, label, argv, path, timeout)


# ----------------------------------------------------------------------------- items


def item_small(recorder, suite, tmp, budget):
    for batch in suite.small_batches:
        reference(recorder, "small", f"torch B={batch}", suite, tmp, budget(200), preset=suite.small, batch=batch)
        ours(recorder, "small", f"ours B={batch}", suite, tmp, budget(200), preset=suite.small, batch=batch)


def item_variants(recorder, suite, tmp, budget):
    first = suite.small_batches[0]
    for name, settings in VARIANTS.items():
        ours(recorder, "small", f"ours B={first} {name}", suite, tmp, budget(150), preset=suite.small, batch=first,
             **settings)


def item_extra(recorder, suite, tmp, budget):
    for batch in suite.extra_batches:
        ours(recorder, "small", f"ours B={batch}", suite, tmp, budget(150), preset=suite.small, batch=batch)
        reference(recorder, "small", f"torch B={batch}", suite, tmp, budget(150), preset=suite.small, batch=batch)


def traced_run(recorder, suite, tmp, budget, *, item: str, preset: str, batch: int, remat: str, timeout: float,
               env: dict | None) -> None:
    """One of our runs under jax.profiler; its summary goes to <item>.txt and results[<item>_summary]."""
    trace_dir = os.path.join(tmp, f"trace_{item}")
    row = ours(recorder, item, f"ours B={batch} remat={remat} (traced)", suite, tmp, budget(timeout), preset=preset,
               batch=batch, remat=remat, profile_dir=trace_dir, env=env)
    files = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    if not files:
        raise RuntimeError(f"no trace written under {trace_dir}")
    summary = summarise_trace(files[0], suite.steps, row.get("step_time_s"))
    with open(os.path.join(recorder.out, f"{item}.txt"), "w") as f:
        f.write(summary)
    recorder.results[f"{item}_summary"] = summary
    recorder.write()


def item_profile(recorder, suite, tmp, budget):
    dump_dir = os.path.join(tmp, "hlo")
    traced_run(recorder, suite, tmp, budget, item="profile", preset=suite.small, batch=suite.small_batches[0],
               remat="none", timeout=150,
               env={"XLA_FLAGS": f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=train_step"})
    dumps = glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))
    if dumps:  # the optimized HLO names every fusion the profile lists
        shutil.copy(max(dumps, key=os.path.getsize), os.path.join(recorder.out, "step_hlo.txt"))


def item_xl_profile(recorder, suite, tmp, budget):
    _, batch, remat = next(run for run in suite.xl_runs if run[0] == "jax")
    traced_run(recorder, suite, tmp, budget, item="profile_xl", preset=suite.xl, batch=batch, remat=remat,
               timeout=300, env=None)


def item_tune(recorder, suite, tmp, budget):
    """scripts/tune_attention.py, again with serial compiles (--workers=1) if the parallel ones broke it."""
    table, rows = os.path.join(recorder.out, "flash_attention_tuning.json"), os.path.join(tmp, "tune.json")
    for workers in (None, 1):
        limit = budget(420)
        argv = [os.path.join(SCRIPTS, "tune_attention.py"), *suite.tune_args, f"--table={table}", f"--json={rows}",
                f"--budget_s={max(limit - 90, 10):.0f}", *([f"--workers={workers}"] if workers else [])]
        rc, output = run_child(recorder, argv, limit)
        if os.path.exists(rows):
            break
    if not os.path.exists(rows):
        recorder.results["attention"] = {"note": "timed out" if rc is None else f"exit {rc}", "output": output[-4000:]}
        return
    with open(rows) as f:
        tuned = json.load(f)
    recorder.results["attention"] = {**tuned["source"], "rows": tuned["compare"]}
    recorder.results["tune"] = {"entries": tuned["entries"], "kernels": tuned["kernels"], "skipped": tuned["skipped"]}


def item_xl(recorder, suite, tmp, budget):
    for framework, batch, remat in suite.xl_runs:
        if framework == "torch":
            reference(recorder, "xl", f"torch B={batch}", suite, tmp, budget(300), preset=suite.xl, batch=batch)
        else:
            ours(recorder, "xl", f"ours B={batch} remat={remat}", suite, tmp, budget(300), preset=suite.xl,
                 batch=batch, remat=remat)


def flag_variant(name: str) -> tuple[str, dict]:
    """(XLA_FLAGS, settings of ours) of a --flags entry: a FLAG_VARIANTS name, or names joined by '&'."""
    flags, settings = [], {}
    for part in name.split("&"):
        variant = FLAG_VARIANTS[part.strip()]
        flags += [variant["xla_flags"]] if variant.get("xla_flags") else []
        settings.update({k: v for k, v in variant.items() if k not in ("xla_flags", "overrides")})
        settings["overrides"] = {**settings.get("overrides", {}), **variant.get("overrides", {})}
    return " ".join(flags), settings


def item_flags(recorder, suite, tmp, budget):
    batch = suite.small_batches[0]
    for name in suite.flags:
        xla_flags, settings = flag_variant(name)
        ours(recorder, "flags", f"ours B={batch} {name}", suite, tmp, budget(150), preset=suite.small, batch=batch,
             env={"XLA_FLAGS": xla_flags}, **settings)


def item_fp8(recorder, suite, tmp, budget):
    """Per (preset, batch): the PyTorch reference, ours in bf16 and ours with FP8 matmuls, each timed over
    loss_steps steps of the same batch (its final loss compares the three; tokens/s the speed)."""
    for preset, batch in suite.fp8_runs:
        cap = 300 if preset == suite.xl else 200
        reference(recorder, "fp8", f"torch {preset} B={batch}", suite, tmp, budget(cap), preset=preset, batch=batch,
                  steps=suite.loss_steps)
        for label, matmul_dtype in (("bf16", None), ("fp8", "fp8")):
            ours(recorder, "fp8", f"ours {preset} B={batch} {label}", suite, tmp, budget(cap), preset=preset,
                 batch=batch, steps=suite.loss_steps, overrides={"matmul_dtype": matmul_dtype})


def item_dropout(recorder, suite, tmp, budget):
    batch = suite.small_batches[0]
    residual = {"dropout_rate": 0.1}
    ours(recorder, "dropout", f"ours B={batch} residual dropout 0.1, threefry", suite, tmp, budget(150),
         preset=suite.small, batch=batch, overrides=residual)
    ours(recorder, "dropout", f"ours B={batch} residual dropout 0.1, rbg", suite, tmp, budget(150),
         preset=suite.small, batch=batch, overrides=residual, env={"JAX_DEFAULT_PRNG_IMPL": "rbg"})
    ours(recorder, "dropout", f"ours B={batch} residual + attention dropout 0.1 (xla attention)", suite, tmp,
         budget(150), preset=suite.small, batch=batch, overrides={"dropout_rate": 0.1, "attention_dropout_rate": 0.1})


def item_moe(recorder, suite, tmp, budget):
    headline.item_moe(recorder, suite, tmp, budget, run_child=run_child, scripts=SCRIPTS,
                      smoke=suite.small == SMOKE.small)


RUNNERS = {"small": item_small, "profile": item_profile, "tune": item_tune, "xl": item_xl,
           "xl_profile": item_xl_profile, "fp8": item_fp8, "flags": item_flags, "dropout": item_dropout,
           "variants": item_variants, "extra": item_extra, "moe": item_moe}


# ----------------------------------------------------------------------------- main


def parse_runs(text: str) -> tuple[tuple[str, int, str], ...]:
    """'jax:12:none,torch:8:none' -> (("jax", 12, "none"), ("torch", 8, "none"))."""
    runs = []
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) != 3 or fields[0] not in ("jax", "torch") or not fields[1].isdigit():
            raise argparse.ArgumentTypeError(f"{part!r} is not framework:batch:remat (e.g. jax:12:none)")
        runs.append((fields[0], int(fields[1]), fields[2]))
    return tuple(runs)


def parse_presets(text: str) -> tuple[tuple[str, int], ...]:
    """'gpt2_small:16,gpt2_xl:8' -> (("gpt2_small", 16), ("gpt2_xl", 8))."""
    runs = []
    for part in text.split(","):
        fields = part.split(":")
        if len(fields) != 2 or not fields[1].isdigit():
            raise argparse.ArgumentTypeError(f"{part!r} is not preset:batch (e.g. gpt2_xl:8)")
        runs.append((fields[0], int(fields[1])))
    return tuple(runs)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for results.md, results.json, profile.txt, log.txt")
    p.add_argument("--smoke", action="store_true", help="tiny shapes and steps (runs on a CPU)")
    p.add_argument("--only", type=lambda s: s.split(","), default=list(ITEMS), help=f"items, from {ITEMS}")
    p.add_argument("--ours", type=json.loads, default={"cross_entropy": "chunked", "overrides": {"scan_layers": False}},
                   help="JSON: our settings for every run (attention, cross_entropy, overrides); variants change one")
    p.add_argument("--xl_runs", type=parse_runs, default=None,
                   help="1.5B runs as framework:batch:remat,... (jax or torch), instead of the suite's")
    p.add_argument("--flags", type=lambda s: tuple(s.split(",")), default=None,
                   help=f"variants for 'flags' (XLA_FLAGS and settings), from {tuple(FLAG_VARIANTS)}, or several "
                        "joined by '&' (one row with all of them), instead of all")
    p.add_argument("--fp8_runs", type=parse_presets, default=None,
                   help="'fp8' item's runs as preset:batch,... (each: torch, ours bf16, ours fp8), instead of "
                        "the suite's")
    p.add_argument("--loss_steps", type=int, default=None, help="'fp8' item's timed steps, instead of the suite's")
    p.add_argument("--plan", choices=["headline"], help="the prepared device check: items small (first batch), xl, "
                   "moe; sets --only unless given")
    p.add_argument("--headline", help="write the headline figures (device, 124M, 1.5B, MoE) as JSON here")
    p.add_argument("--budget_s", type=float, default=540.0, help="stop starting runs after this many seconds")
    p.add_argument("--min_run_s", type=float, default=45.0, help="skip a run when less than this is left")
    args = p.parse_args(argv)
    if args.plan == "headline" and not any(a.startswith("--only") for a in (argv if argv is not None else sys.argv)):
        args.only = list(headline.PLAN_HEADLINE)
    unknown = set(args.only) - set(ITEMS)
    if unknown:
        p.error(f"unknown items {sorted(unknown)}; choose from {ITEMS}")
    unknown = {part.strip() for name in args.flags or () for part in name.split("&")} - set(FLAG_VARIANTS)
    if unknown:
        p.error(f"unknown --flags {sorted(unknown)}; choose from {tuple(FLAG_VARIANTS)}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    suite = SMOKE if args.smoke else FULL
    if args.plan == "headline":  # the 124M pair at the first batch size only
        suite = dataclasses.replace(suite, small_batches=suite.small_batches[:1])
    suite = dataclasses.replace(suite, xl_runs=args.xl_runs or suite.xl_runs, flags=args.flags or suite.flags,
                                fp8_runs=args.fp8_runs or suite.fp8_runs,
                                loss_steps=args.loss_steps or suite.loss_steps)
    recorder = Recorder(args.out, suite, args.ours)
    deadline = time.monotonic() + args.budget_s

    def budget(cap: float) -> float:
        """Seconds the next run may take: at most `cap`, within what is left of --budget_s."""
        left = deadline - time.monotonic()
        if left < args.min_run_s:
            raise TimeoutError(f"{left:.0f}s of the budget left")
        return min(left, cap)

    with tempfile.TemporaryDirectory() as tmp:
        for item in [i for i in ITEMS if i in args.only]:
            try:
                RUNNERS[item](recorder, suite, tmp, budget)
            except TimeoutError as stop:
                recorder.results.setdefault("skipped", {})[item] = f"stopped: {stop}"
            except Exception as error:  # one item's failure must not lose the others
                recorder.results.setdefault("errors", {})[item] = f"{type(error).__name__}: {error}"
            recorder.write()
    print(markdown(recorder.results))
    if args.headline:
        print(json.dumps(headline.write_headline(recorder.results, args.headline), indent=2))


if __name__ == "__main__":
    main()
