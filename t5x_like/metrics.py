"""MFU accounting (FLOPs come from the model: LanguageModel.flops_per_step), metric writers (metrics.jsonl, TensorBoard) and the console line."""
from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Mapping

from absl import logging


# Dense bf16 peak TFLOP/s per device, by a substring of jax's device_kind (lower case).
PEAK_TFLOPS = (
    ("h200", 989.0), ("h100", 989.0), ("a100", 312.0),
    ("tpu v5p", 459.0), ("tpu v5 lite", 197.0), ("tpu v5e", 197.0), ("tpu v5", 459.0),  # v5p reports "TPU v5"
    ("tpu v4", 275.0),
)


def peak_tflops(device_kind: str) -> float | None:
    """Dense bf16 peak of one device, or None when the kind is not in PEAK_TFLOPS."""
    kind = device_kind.lower()
    return next((peak for name, peak in PEAK_TFLOPS if name in kind), None)


METRICS_FILE = "metrics.jsonl"


def read_rows(model_dir: str) -> list[dict]:
    """The rows of MODEL_DIR/metrics.jsonl (none when it does not exist)."""
    path = os.path.join(model_dir, METRICS_FILE)
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def drop_rows_after(model_dir: str, step: int) -> int:
    """Rewrite metrics.jsonl (atomically) without the rows of steps after `step`, which a resumed run
    computes again; returns how many rows were dropped. A torn last line (a killed writer) goes too."""
    path = os.path.join(model_dir, METRICS_FILE)
    if not os.path.exists(path):
        return 0
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    kept = [line for line in lines if line.endswith("\n") and json.loads(line)["step"] <= step]
    if len(kept) != len(lines):
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(kept)
        os.replace(path + ".tmp", path)
    return len(lines) - len(kept)


def tensorboardx_writer() -> type:
    """tensorboardX's SummaryWriter, imported without torch: tensorboardX imports torch, where it is installed,
    only to accept torch tensors (we give it floats), and that import costs a training process 1.6 s of CPU and
    hundreds of MB at start-up."""
    if "torch" in sys.modules:
        from tensorboardX import SummaryWriter
        return SummaryWriter
    sys.modules["torch"] = None  # `import torch` raises ImportError, which tensorboardX expects without torch
    try:
        from tensorboardX import SummaryWriter
    finally:
        del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
    """Writes rows to MODEL_DIR/metrics.jsonl and TensorBoard; a no-op on non-primary hosts.

    A run (re)starting at `start_step` first drops the rows of later steps from metrics.jsonl, and
    TensorBoard purges its events from the steps after it, so a resumed run's rows appear once. Its events go
    to `tensorboard_dir` (default MODEL_DIR/tensorboard)."""

    def __init__(self, model_dir: str, *, enabled: bool = True, start_step: int = 0,
                 tensorboard_dir: str | None = None):
        self.enabled = enabled
        self.tensorboard = tensorboard_dir or os.path.join(model_dir, "tensorboard")
        self._jsonl = None
        self._tb = None
        if enabled:
            SummaryWriter = tensorboardx_writer()
            os.makedirs(model_dir, exist_ok=True)
            dropped = drop_rows_after(model_dir, start_step)
            if dropped:
                logging.info("%s: dropped %d rows of steps after %d (they are computed again)",
                             os.path.join(model_dir, METRICS_FILE), dropped, start_step)
            self._jsonl = open(os.path.join(model_dir, METRICS_FILE), "a", encoding="utf-8")
            self._tb = SummaryWriter(self.tensorboard, purge_step=start_step + 1)

    def write(self, step: int, row: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": int(step), **{k: _plain(v) for k, v in row.items()}}
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()
        for name, value in row.items():
            if name != "step" and isinstance(value, (int, float)) and value is not None and math.isfinite(value):
                self._tb.add_scalar(name, value, int(step))
        self._tb.flush()

    def close(self) -> None:
        if self.enabled:
            self._jsonl.close()
            self._tb.close()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    value = float(value)
    return value if math.isfinite(value) else str(value)


class Throughput:
    """Step-time, tokens/s, TFLOP/s per device and MFU over the steps between two log points, counting the rows
    each step trains on (`step_done(rows)`): a step of a batch-size ramp-up computes all `rows_per_step` rows of
    the compiled batch but trains on fewer, and only those count."""

    def __init__(self, *, rows_per_step: int, tokens_per_step: int, flops_per_step: float, num_devices: int,
                 peak: float | None):
        self.rows_per_step = rows_per_step
        self.tokens_per_step = tokens_per_step
        self.flops_per_step = flops_per_step
        self.num_devices = num_devices
        self.peak = peak
        self.reset()

    def step_done(self, rows: int) -> None:
        self._steps += 1
        self._rows += rows

    def reset(self) -> None:
        self._start, self._steps, self._rows = time.perf_counter(), 0, 0

    def measure(self) -> dict[str, float | None]:
        """Averages since the last measure(); call after the last step's result is on the host."""
        elapsed = time.perf_counter() - self._start
        step_time = elapsed / max(self._steps, 1)
        full_steps = self._rows / self.rows_per_step  # the steps' rows, in whole batches
        tflops = self.flops_per_step * full_steps / elapsed / self.num_devices / 1e12
        self.reset()
        return {
            "step_time": step_time,
            "tokens_per_sec": self.tokens_per_step * full_steps / elapsed,
            "tflops_per_device": tflops,
            "mfu": tflops / self.peak if self.peak else None,
        }


def console_line(step: int, total: int, row: Mapping[str, Any], step_time: float) -> str:
    """'step 120/2000 (6.0%) loss 4.210 | lr 3.0e-04 | 12,345 tok/s | ETA 0:03:10'."""
    eta = int((total - step) * step_time)
    parts = [f"step {step}/{total} ({100.0 * step / total:.1f}%)", f"loss {row['loss']:.4f}",
             f"grad_norm {row['grad_norm']:.3f}", f"lr {row['learning_rate']:.2e}",
             f"{row['tokens_per_sec']:,.0f} tok/s", f"{row['step_time'] * 1000:.0f} ms/step"]
    if row.get("mfu") is not None:
        parts.append(f"MFU {100 * row['mfu']:.1f}%")
    parts.append(f"ETA {eta // 3600}:{eta % 3600 // 60:02d}:{eta % 60:02d}")
    return " | ".join(parts)


