"""scripts/benchmark_train.py run as users run it (a subprocess; a one-layer gpt2_tiny, batch 8 x 32, 2 steps on a
data x fsdp mesh of 2 CPU devices): its printed row and --json file agree, and the numbers hang together."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.environment import cpu_env

pytestmark = pytest.mark.system

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_train.py"


def test_a_tiny_run_prints_and_writes_its_row(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--preset=gpt2_tiny", '--overrides={"num_layers": 1}',
                           "--batch_size=8", "--seq_len=32", "--steps=2", "--warmup=1", "--dtype=float32",
                           "--data=1", "--fsdp=2", "--json=row.json"],
                          cwd=tmp_path, env=cpu_env(2), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((tmp_path / "row.json").read_text())
    assert json.loads(done.stdout) == row
    assert (row["preset"], row["devices"], row["mesh"]["fsdp"], row["batch_size"], row["seq_len"]) == \
        ("gpt2_tiny", 2, 2, 8, 32)
    assert row["tokens_per_sec"] == pytest.approx(8 * 32 / row["step_time_s"])
    assert row["step_time_s"] > 0 and row["peak_memory_gib"] > 0 and row["memory_source"] == "compiled estimate"
    assert abs(row["first_loss"] - math.log(8192)) < 0.15 and row["final_loss"] < row["first_loss"]  # 8192 ids
