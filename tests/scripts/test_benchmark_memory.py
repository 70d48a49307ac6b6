"""scripts/benchmark_memory.py run as users run it (a subprocess; here the quickstart model, a tiny batch and one
row, compiled ahead of time for 8 CPU devices): the row's table line and its report, whose train state per device
is FSDP's 12 bytes per parameter (fp32 weights + Adam's two moments) over 8 devices."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.environment import cpu_env

pytestmark = pytest.mark.system

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_memory.py"
ROW = "FSDP=8, remat full"


def test_one_row_compiles_and_its_state_is_sharded_eight_ways(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--gin_file=quickstart.gin", "--topology=cpu:8",
                           "--batch_size=8", "--seq_len=32", "--output_dir=memory", "--only", ROW],
                          cwd=tmp_path, env=cpu_env(8), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "quickstart.gin (5M parameters, float32), batch 8 x 32, cpu:8" in done.stdout, done.stdout
    line = next(line for line in done.stdout.splitlines() if line.startswith(f"| {ROW} |"))
    assert "failed" not in line
    state, arguments, temporaries, total, host = (float(cell) for cell in line.split("|")[2:7])
    assert total == pytest.approx(arguments + temporaries, abs=2e-3) and temporaries > 0 and host == 0
    report = json.loads((tmp_path / "memory" / "FSDP=8,_remat_full.json").read_text())
    assert report["state_bytes_per_device"] == pytest.approx(12 * report["num_params"] / 8, rel=0.02)
    assert state == pytest.approx(report["state_bytes_per_device"] / 2**30, abs=1e-3)
