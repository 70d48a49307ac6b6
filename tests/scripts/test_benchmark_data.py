import pytest
"""scripts/benchmark_data.py's loader part, run as users run it (a subprocess, tiny batches, the builtin corpus's
token file): both loader rows are printed with a positive rate. (The preprocessing part has its own test.)"""
import re
import subprocess
import sys
from pathlib import Path

from t5x_like.data.builtin import builtin_corpus

pytestmark = pytest.mark.system

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "benchmark_data.py"


def test_the_loader_part_prints_a_fixed_length_and_a_packed_row(tmp_path):
    prefix, _ = builtin_corpus()
    done = subprocess.run([sys.executable, str(SCRIPT), f"--token_file={prefix}", "--batch_size=4", "--seq_len=64",
                           "--loader_seconds=0.3"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = dict(re.findall(r"^\| loader: (fixed-length|packed) 4 x 64, 1 host process \| ([\d,]+) \|$", done.stdout,
                           re.M))
    assert set(rows) == {"fixed-length", "packed"}, done.stdout
    assert all(int(rate.replace(",", "")) > 0 for rate in rows.values())
    assert "load average" in done.stdout and "preprocess" not in done.stdout
