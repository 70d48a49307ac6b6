"""Kill the trainer with SIGKILL at random moments, resume, and check the result is bitwise what an
uninterrupted run gives; also measures the cost of checkpoint checksums per GB of state.

    python scripts/fault_injection.py --trials=20 --workdir=/tmp/faults
    python scripts/fault_injection.py --checksum_gb=2        # CRC-32 cost only

A trial starts the quickstart CLI (a tiny model, the builtin corpus, a checkpoint every 2 steps) and
kills it either at a uniformly random moment of the run or the moment a checkpoint's temporary
directory appears (a kill during a checkpoint write), then restarts it until it completes. It passes
when every loss in metrics.jsonl (one row per step, none duplicated) and every parameter of the final
checkpoint equal the uninterrupted reference's bit for bit. Prints a JSON summary.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # read back what the runs wrote
os.environ.setdefault("JAX_PLATFORMS", "cpu")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("{'num_layers': 1, 'embed_dim': 32, 'num_heads': 2, 'mlp_dim': 64, 'max_len': 32, "
        "'dropout_rate': 0.0, 'attention_dropout_rate': 0.0}")


def train_command(model_dir: str, steps: int) -> list[str]:
    return [sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin", f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.TRAIN_STEPS={steps}", "--gin.WARMUP_STEPS=1", "--gin.BATCH_SIZE=4", "--gin.SEQ_LEN=32",
            "--gin.EVAL_EVERY=0", "--gin.CHECKPOINT_EVERY=2", "--gin.train.log_every=1",
            f"--gin.model_config.overrides={TINY}"]


def environment() -> dict:
    """The runs' environment: 2 CPU devices, and any other XLA flags of the caller's (the test suite's cheap CPU
    code generation)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    return dict(os.environ, XLA_FLAGS=" ".join(["--xla_force_host_platform_device_count=2", *flags]),
                JAX_PLATFORMS="cpu", PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_to_end(model_dir: str, steps: int) -> float:
    started = time.perf_counter()
    done = subprocess.run(train_command(model_dir, steps), cwd=REPO, env=environment(), capture_output=True,
                          text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"train failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return time.perf_counter() - started


def kill_at(model_dir: str, steps: int, *, after_s: float | None) -> str:
    """Start a run and SIGKILL it `after_s` seconds in, or (None) when a checkpoint write is under way;
    returns what happened ('killed at ...' or 'finished first')."""
    process = subprocess.Popen(train_command(model_dir, steps), cwd=REPO, env=environment(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.perf_counter()
    tmp_pattern = os.path.join(model_dir, "checkpoints", "*.orbax-checkpoint-tmp*")
    while process.poll() is None:
        elapsed = time.perf_counter() - started
        writing = glob.glob(tmp_pattern)
        if (after_s is not None and elapsed >= after_s) or (after_s is None and writing):
            process.send_signal(signal.SIGKILL)
            process.wait()
            return f"killed at {elapsed:.1f}s" + (" during a checkpoint write" if writing else "")
        time.sleep(0.005)
    return "finished first"


def outcome(model_dir: str, steps: int) -> tuple[dict, dict]:
    """(losses by step, asserting one row per step; the final checkpoint's parameters)."""
    import jax
    import numpy as np

    from t5x_like import metrics
    from t5x_like.checkpoint import store

    rows = [r for r in metrics.read_rows(model_dir) if "loss" in r]
    found = [r["step"] for r in rows]
    if found != list(range(1, steps + 1)):
        raise AssertionError(f"{model_dir}: metrics.jsonl steps {found}, expected 1..{steps} once each")
    params = jax.device_get(store.restore_params(model_dir, None))
    flat = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)}
    return {r["step"]: r["loss"] for r in rows}, flat


def same(a: tuple[dict, dict], b: tuple[dict, dict]) -> bool:
    import numpy as np
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(np.array_equal(a[1][k], b[1][k]) for k in a[1])


def run_trials(trials: int, steps: int, workdir: str, seed: int = 0) -> dict:
    rng = random.Random(seed)
    reference_dir = os.path.join(workdir, "reference")
    shutil.rmtree(reference_dir, ignore_errors=True)
    reference_s = run_to_end(reference_dir, steps)
    reference = outcome(reference_dir, steps)
    results = []
    for trial in range(trials):
        model_dir = os.path.join(workdir, f"trial{trial}")
        shutil.rmtree(model_dir, ignore_errors=True)
        during_write = trial % 2 == 0
        event = kill_at(model_dir, steps, after_s=None if during_write else rng.uniform(0.5, reference_s))
        resume_s = run_to_end(model_dir, steps)
        results.append({"trial": trial, "event": event, "exact": same(outcome(model_dir, steps), reference),
                        "resume_s": round(resume_s, 1)})
        print(json.dumps(results[-1]), flush=True)
        shutil.rmtree(model_dir, ignore_errors=True)
    return {"trials": trials, "exact": sum(r["exact"] for r in results),
            "killed_during_checkpoint_write": sum("checkpoint write" in r["event"] for r in results),
            "finished_before_kill": sum(r["event"] == "finished first" for r in results),
            "reference_run_s": round(reference_s, 1), "results": results}


def checksum_cost(gb: float, workdir: str) -> dict:
    """Seconds per GB to write a manifest and to verify it, over `gb` GB of files like a checkpoint's."""
    from t5x_like.checkpoint import integrity

    step_dir = os.path.join(workdir, "checksum_cost")
    shutil.rmtree(step_dir, ignore_errors=True)
    os.makedirs(os.path.join(step_dir, "params"))
    files, size = 8, int(gb * 1e9 / 8)
    for i in range(files):
        with open(os.path.join(step_dir, "params", f"shard{i}"), "wb") as f:
            f.write(os.urandom(size))
    started = time.perf_counter()
    integrity.write_manifest(step_dir)
    write_s = time.perf_counter() - started
    started = time.perf_counter()
    assert integrity.verify_manifest(step_dir)
    verify_s = time.perf_counter() - started
    shutil.rmtree(step_dir)
    return {"gb": gb, "files": files, "write_s_per_gb": round(write_s / gb, 3), "verify_s_per_gb": round(verify_s / gb, 3),
            "cpu_count": os.cpu_count(), "note": "files in the page cache: hashing cost, not disk reads"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=0)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checksum_gb", type=float, default=0.0, help="measure checksum cost over this much state")
    p.add_argument("--workdir", default=None)
    args = p.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="fault_injection_")
    summary = {}
    if args.checksum_gb:
        summary["checksum"] = checksum_cost(args.checksum_gb, workdir)
    if args.trials:
        summary["faults"] = run_trials(args.trials, args.steps, workdir, args.seed)
    print(json.dumps(summary, indent=2))
    if args.trials and summary["faults"]["exact"] != args.trials:
        sys.exit(1)


if __name__ == "__main__":
    main()
