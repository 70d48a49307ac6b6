"""scripts/benchmark_preprocess.py at a tiny size, run as users run it (a subprocess from a folder of its own,
relative paths): the plain loop's and ours' rows are printed, and ours wrote the plain loop's ids.
(Megatron-LM's rows need its checkout; docs/benchmarks.md has the measurement.)"""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support.shared_data import shared_file

pytestmark = pytest.mark.system

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "benchmark_preprocess.py"


def test_the_plain_loop_and_ours_rows_on_a_tiny_corpus(tmp_path):
    shared_file("gpt2-bpe"), shared_file("wikitext")  # the script reads them from ../shared/data
    done = subprocess.run([sys.executable, str(SCRIPT), "--corpus_mb=0.3", "--workers=1", "--trials=1",
                           "--work_dir=work"], cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = {name: cells for name, cells in re.findall(r"^\| (plain loop|ours|Megatron) \| (.*) \|$", done.stdout, re.M)}
    assert set(rows) == {"plain loop", "ours"}, done.stdout
    cells = {name: [c.strip() for c in row.split("|")] for name, row in rows.items()}
    # workers, tokens, MB, seconds, MB/s, x plain, per worker x plain, ours / Megatron, CPU s, load
    assert cells["plain loop"][:1] == cells["ours"][:1] == ["1"]
    assert cells["plain loop"][5:7] == ["1.00x", "1.00x"] and float(cells["ours"][4]) > 0
    assert float(cells["plain loop"][8]) > 0 and float(cells["ours"][8]) > 0  # CPU seconds of the process tree
    assert "ours: the same ids as the plain loop" in done.stdout and "load average before" in done.stdout

    corpus = tmp_path / "work" / "wikitext103_0.3MB.jsonl"
    assert 0.3e6 <= corpus.stat().st_size < 0.4e6
    plain = np.fromfile(tmp_path / "work" / "plain.bin", np.uint16)
    ours = np.fromfile(tmp_path / "work" / "ours_1.bin", np.uint16)
    assert len(plain) == int(cells["ours"][1].replace(",", "")) > 50_000
    np.testing.assert_array_equal(ours, plain)
    assert (plain == 50256).sum() == len(corpus.read_text().splitlines())  # one end-of-document id a line
