import json
import math

import pytest

from t5x_like import metrics


@pytest.mark.parametrize("kind, peak", [
    ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("TPU v4", 275.0), ("TPU v5 lite", 197.0), ("TPU v5e", 197.0), ("TPU v5p", 459.0), ("TPU v5", 459.0),
    ("cpu", None), ("NVIDIA GeForce RTX 4090", None),
])
def test_peak_tflops_by_device_kind(kind, peak):
    assert metrics.peak_tflops(kind) == peak


def test_writer_appends_rows_and_keeps_nonfinite_values_readable(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path))
    writer.write(10, {"loss": 2.5, "mfu": None})
    writer.write(20, {"loss": math.nan})
    writer.close()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows == [{"step": 10, "loss": 2.5, "mfu": None}, {"step": 20, "loss": "nan"}]
    assert list((tmp_path / "tensorboard").iterdir())


def test_non_primary_writer_writes_nothing(tmp_path):
    writer = metrics.MetricsWriter(str(tmp_path / "x"), enabled=False)
    writer.write(1, {"loss": 1.0})
    writer.close()
    assert not (tmp_path / "x").exists()


def test_console_line_has_progress_and_eta():
    row = {"loss": 3.25, "grad_norm": 0.5, "learning_rate": 3e-4, "tokens_per_sec": 12345.0,
           "step_time": 0.5, "mfu": 0.41}
    line = metrics.console_line(100, 300, row, 0.5)
    assert "step 100/300 (33.3%)" in line and "MFU 41.0%" in line and "ETA 0:01:40" in line


def test_throughput_counts_the_rows_each_step_trains_on(monkeypatch):
    """Two ramp-up steps of 2 and 6 rows out of a compiled batch of 8 take 2 s: one batch's tokens and FLOPs."""
    clock = iter([100.0, 102.0, 102.0])  # started, measured, started again
    monkeypatch.setattr(metrics.time, "perf_counter", lambda: next(clock))
    throughput = metrics.Throughput(rows_per_step=8, tokens_per_step=8 * 16, flops_per_step=4e12, num_devices=2,
                                    peak=0.5)
    throughput.step_done(2)
    throughput.step_done(6)
    assert throughput.measure() == {"step_time": 1.0, "tokens_per_sec": 64.0, "tflops_per_device": 1.0, "mfu": 2.0}


@pytest.mark.system
def test_the_writer_does_not_import_torch_and_writes_tensorboard_events(tmp_path):
    """tensorboardX imports torch where it is installed; MetricsWriter keeps that 1.6 s of CPU out of every training
    process (a fresh one: the suite's workers have imported torch already)."""
    import subprocess
    import sys

    code = ("import sys; from t5x_like import metrics; w = metrics.MetricsWriter(sys.argv[1]); "
            "w.write(1, {'loss': 2.0}); w.close(); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False"]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
