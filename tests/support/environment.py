"""The XLA environment of the suite's workers and of the processes its tests start (imported by tests/conftest.py
before jax is, and by tests that start processes)."""
import contextlib
import gc
import os

# The XLA:CPU flags of the suite's workers and of the processes its tests start (CLIs, multi-process runs, the
# documented commands), chosen because the suite's small programs spend their time compiling, not running:
# - single-threaded Eigen inside each op: the suite already runs one worker per core, and the multi-threaded pool
#   has wedged a restore on a 2-core CI machine (a known XLA:CPU hazard; no slower here);
# - XLA's cheapest code generation (optimisation level 0, no expensive LLVM passes): a tiny T5's train step
#   15.6 -> 6.9 s;
# - the classic fusion emitters instead of the MLIR ones: the workers' compile time 1850 -> about 500 s over the
#   whole suite (docs/testing.md), capped at AVX2 so that the code run is the code verified here whatever CI's CPU is
#   (XLA generates code for the CPU it runs on). Two CI runs with them in long-lived workers lost a worker late in
#   the run (an abort hundreds of tests into one process) while every short-lived process passed; a worker's
#   compiled programs then piled up (23,000 memory mappings and 6.2 GB resident after 640 tests), so every worker
#   now drops them after each test file (release_compiled).
CHEAP_FLAGS = "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0 " \
              "--xla_llvm_disable_expensive_passes=true"
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
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {XLA_CPU_FLAGS}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", CACHE_DIR)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def single_device_programs_only_in_the_cache() -> None:
    """Keep the workers' multi-device programs out of the compilation cache (compiled each time instead).

    An 8-device program that XLA:CPU loads from the cache can run its collectives in another order on each
    simulated device; each device then waits for the others until XLA aborts the process after 60 s
    ("Termination timeout for `all reduce RendezvousKey...`"). It took a CI worker in test_bert_training's
    data x tensor run: 6 of 6 runs from a warm cache aborted, 0 of 3 compiling it. (XLA's list-order scheduler,
    --xla_cpu_enable_concurrency_optimized_scheduler=false, cured that program and broke another:
    test_sequence_parallel then aborted 4 runs in 5 even when compiled.) The hook is jax's own cache-key
    function: a program without a key is compiled and not written."""
    from jax._src import compiler

    keyed = compiler._get_cache_key

    def key_for_single_device_programs(options, backend, computation, devices, *args, **kwargs):
        if getattr(devices, "size", 1) > 1:
            return None
        return keyed(options, backend, computation, devices, *args, **kwargs)

    compiler._get_cache_key = key_for_single_device_programs


def release_compiled() -> None:
    """Drop this process's compiled programs (jax's in-memory caches) and what only they kept alive; the
    persistent compilation cache still holds them, so a later test file that needs one loads it instead of
    compiling. Without this a worker's programs pile up over the run (see XLA_CPU_FLAGS); with it its memory
    mappings stay under about 5,500 and its resident memory under 2.6 GB (the whole suite, measured)."""
    import jax

    jax.clear_caches()
    gc.collect()


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
