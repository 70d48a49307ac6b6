"""scripts/benchmark_moe.py run as users run it (a subprocess; mixtral_tiny cut to one layer, batch 4 x 16, one
timed step on one CPU device): its three rows, the dense one as many active weights per token as the experts
(all but the router's), and the ratios against it."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.environment import cpu_env

pytestmark = pytest.mark.system
SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_moe.py"


def test_a_tiny_run_prints_three_rows_and_writes_them(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), '--overrides={"num_layers": 1}', "--batch_size=4",
                           "--seq_len=16", "--steps=1", "--warmup=1", "--output=moe.json"],
                          cwd=tmp_path, env=cpu_env(1), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    dense, dropless, capacity = json.loads((tmp_path / "moe.json").read_text())
    assert (dense["family"], dropless["family"], capacity["family"]) == ("llama", "mixtral", "mixtral")
    assert dropless["active_params_per_token"] - dense["active_params_per_token"] == 256 * 4  # the router's
    assert dense["vs_dense"] == 1.0 and capacity["vs_dense"] == pytest.approx(
        capacity["tokens_per_sec"] / dense["tokens_per_sec"])
    assert all(row["final_loss"] > 0 and row["step_time_s"] > 0 for row in (dense, dropless, capacity))
    for row in (dense, dropless, capacity):
        assert f"| {row['variant']} | {row['family']} | {row['active_params_per_token']:,} |" in done.stdout
