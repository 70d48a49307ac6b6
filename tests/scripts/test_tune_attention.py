"""scripts/tune_attention.py as a user runs it (from a folder of their own, relative paths), on a tiny CPU shape
in interpret mode: each kernel's candidates are compiled, checked against the default launch and timed, and the
table it writes is one the kernels and 'auto' read."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from models.kernels import flash_attention_tuning as tuning_table
from models.kernels.flash_attention_tuning import KernelTuning, Tuning
from scripts import tune_attention

SCRIPT = pathlib.Path(__file__).parents[2] / "scripts" / "tune_attention.py"


@pytest.mark.system
def test_smoke_run_writes_a_table_the_kernels_and_auto_read(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--table=table.json", "--json=rows.json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "# wrote 1 entries to table.json" in result.stdout
    rows = json.loads((tmp_path / "rows.json").read_text())
    kernels = {row["kernel"] for row in rows["kernels"]}
    assert kernels == {"forward", "dq", "dkv", "fused"}
    assert all(row["ok"] and row["error"] < 1e-5 for row in rows["kernels"])  # float32: the same result every launch
    (entry,) = tuning_table.load_table(str(tmp_path / "table.json"))
    assert (entry["platform"], entry["dtype"], entry["head_dim"], entry["length"]) == ("cpu", "float32", 32, 64)
    tuning = Tuning.from_dict(entry["tuning"])
    fastest = {}
    for name in ("forward", "dq", "dkv", "fused"):  # each kernel's pick is its fastest candidate
        timed = {row["launch"]: row["ms"] for row in rows["kernels"] if row["kernel"] == name}
        fastest[name] = (min(timed, key=timed.get), min(timed.values()))
    assert tuning.forward.short() == fastest["forward"][0] and tuning.dq.short() == fastest["dq"][0]
    fused = fastest["fused"][1] < fastest["dq"][1] + fastest["dkv"][1]
    assert tuning.backward == ("fused" if fused else "split")
    assert tuning.dkv.short() == fastest["fused" if fused else "dkv"][0]
    assert entry["fastest"] == min(entry["fwd_bwd_ms"], key=entry["fwd_bwd_ms"].get)
    assert set(entry["fwd_bwd_ms"]) == {"xla", "pallas"}  # cudnn is n/a on CPU; references are not 'auto' choices
    assert tuning_table.nearest_entry("cpu", "float32", True, 32, 4096, entries=(entry,)) == entry


def test_a_rerun_keeps_the_entries_of_other_platforms(tmp_path):
    path = tmp_path / "table.json"
    gpu = {"platform": "gpu", "dtype": "bfloat16", "causal": True, "head_dim": 64, "length": 1024,
           "tuning": Tuning().to_dict(), "fastest": "cudnn", "fwd_bwd_ms": {"cudnn": 1.0}}
    cpu_old = {**gpu, "platform": "cpu", "dtype": "float32", "fastest": "xla"}
    path.write_text(json.dumps({"source": {}, "entries": [gpu, cpu_old]}))
    cpu_new = {**cpu_old, "fastest": "pallas"}
    tune_attention.write_table(str(path), [cpu_new], {"device": "cpu"})
    assert json.loads(path.read_text())["entries"] == [gpu, cpu_new]


def test_the_fused_backward_is_picked_only_when_it_beats_both_split_kernels():
    best = {"forward": (1.0, KernelTuning(128, 64)), "dq": (1.0, KernelTuning(128, 32)),
            "dkv": (1.5, KernelTuning(32, 128)), "fused": (2.4, KernelTuning(64, 128))}
    assert tune_attention.pick_tuning(best) == Tuning(KernelTuning(128, 64), KernelTuning(128, 32),
                                                      KernelTuning(64, 128), backward="fused")
    best["fused"] = (2.6, KernelTuning(64, 128))
    assert tune_attention.pick_tuning(best) == Tuning(KernelTuning(128, 64), KernelTuning(128, 32),
                                                      KernelTuning(32, 128), backward="split")


def test_every_kernel_can_keep_the_default_launch():
    """The default launch is a candidate of every kernel, so tuning never settles on a slower one than it."""
    for name, launches in tune_attention.CANDIDATES.items():
        assert KernelTuning() in launches, name
