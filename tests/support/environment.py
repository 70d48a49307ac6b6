"""The XLA environment of the suite's workers and of the processes its tests start (imported by tests/conftest.py
before jax is, and by tests that start processes)."""
import contextlib
import os

# Single-threaded Eigen inside each XLA:CPU op: the suite already runs one worker per core, and the
# multi-threaded pool has wedged a restore on a 2-core CI machine (a known XLA:CPU hazard; no slower here).
# XLA's cheapest CPU code generation: the suite's small programs spend their time compiling, not running
# (a tiny T5's train step: 15.6 s -> 6.9 s). Sampling once never finished with it: a running sum over a
# vocabulary split across devices, which generate.sample no longer computes (tests/t5x_like/test_generate.py).
CHEAP_FLAGS = "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0 " \
              "--xla_llvm_disable_expensive_passes=true"
# The processes tests start (CLIs, multi-process runs, the documented commands) also use XLA's classic fusion
# emitters instead of its MLIR ones: compiling about halves (a tiny GPT-2's train step 9.6 -> 4.7 CPU s), and
# --xla_cpu_max_isa=AVX2 keeps them to the instructions the runs here use whatever CI's CPU is (XLA generates code
# for the CPU it runs on; this machine has no AVX-512). The pytest workers themselves keep the MLIR emitters: the
# two CI runs with the classic ones in the workers (8d3496c, c7eb6e3) each lost a worker to a fatal signal in native
# code late in the run (at about 89 % and 84 %, hundreds of tests into one process), which no whole run here
# reproduced, while every subprocess test that ran before the second crash there passed. A worker that dies ends
# `make test` at once, naming its test (Makefile).
ISA = "--xla_cpu_max_isa=AVX2"
XLA_CPU_FLAGS = f"{CHEAP_FLAGS} --xla_cpu_use_fusion_emitters=false {ISA}"
# One JAX compilation cache for the suite, its workers and the processes its tests start (they inherit the
# environment): the same small models are compiled by many tests, and a hit loads the executable instead. Every
# program is kept, however quick to compile (test_eval + test_generate + test_lm 178 -> 167 s, one process, from an
# empty cache). It lives in the user's cache directory and is kept between runs: JAX keys each entry by the program,
# jax/jaxlib versions, the XLA flags and the devices, so a changed tree or another flag never loads a stale one. A
# fresh machine (CI's, a newcomer's) starts it empty. A whole run adds about 110 MB; past CACHE_MAX_BYTES the oldest
# entries go when a run starts (prune_cache). Not JAX's own cap (JAX_COMPILATION_CACHE_MAX_SIZE): it lists and reads
# the whole directory on every write, which cost the suite 224 s of system time (462 s against 238 s).
CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                         "t5x_like", "jax-test-cache")
CACHE_MAX_BYTES, CACHE_KEPT_BYTES = 2 << 30, 1 << 30


def configure_this_process() -> None:
    """8 simulated CPU devices with the workers' flags and the shared compilation cache (before jax is imported);
    what the environment already sets wins (`JAX_COMPILATION_CACHE_DIR=$(mktemp -d) make test` runs cold)."""
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {CHEAP_FLAGS}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", CACHE_DIR)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def prune_cache(directory: str) -> None:
    """Past CACHE_MAX_BYTES, delete the oldest entries (by when they were written) down to CACHE_KEPT_BYTES."""
    try:
        entries = sorted((e.stat().st_mtime, e.stat().st_size, e.path) for e in os.scandir(directory) if e.is_file())
    except FileNotFoundError:
        return
    total = sum(size for _, size, _ in entries)
    if total <= CACHE_MAX_BYTES:
        return
    for _, size, path in entries:  # oldest first
        if total <= CACHE_KEPT_BYTES:
            break
        with contextlib.suppress(FileNotFoundError):  # another run pruned it
            os.remove(path)
        total -= size


def cpu_env(devices: int, *, optimized: bool = False, **extra: str) -> dict[str, str]:
    """The environment for a test's subprocess: `devices` simulated CPU devices, the suite's XLA flags, or with
    `optimized` XLA's full CPU optimisation, for a run whose steps cost more than compiling them (tens of steps of
    a quickstart-sized model: the quickstart T5's 30 steps 155 s -> 75 s)."""
    flags = f"--xla_cpu_multi_thread_eigen=false {ISA}" if optimized else XLA_CPU_FLAGS
    return dict(os.environ, JAX_PLATFORMS="cpu",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {flags}", **extra)
