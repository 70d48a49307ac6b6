"""The GPU suite driver's own logic, on a CPU: run lists, flag choices, tables and the profile's busy time."""
import argparse

import pytest

from scripts import benchmark_gpu


def test_xl_runs_and_flags_replace_the_suites():
    args = benchmark_gpu.parse_args(["--out=/tmp/unused", "--only=xl_profile,xl", "--xl_runs=jax:12:none,torch:8:none",
                                     "--flags=default,latency hiding scheduler + triton gemm off"])
    assert args.only == ["xl_profile", "xl"]
    assert args.xl_runs == (("jax", 12, "none"), ("torch", 8, "none"))
    assert args.flags == ("default", "latency hiding scheduler + triton gemm off")


@pytest.mark.parametrize("text", ["jax:x:none", "tf:8:none", "jax:8"])
def test_malformed_run_is_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="framework:batch:remat"):
        benchmark_gpu.parse_runs(text)


def test_unknown_flag_variant_is_refused(capsys):
    with pytest.raises(SystemExit):
        benchmark_gpu.parse_args(["--out=/tmp/unused", "--flags=fast"])
    assert "unknown --flags ['fast']" in capsys.readouterr().err


def test_busy_time_is_the_union_of_overlapping_kernels():
    assert benchmark_gpu.busy_union([(0, 10), (5, 15), (20, 30), (25, 26)]) == 25
    assert benchmark_gpu.busy_union([]) == 0


def test_table_gives_the_ratio_to_the_reference_at_the_same_shape():
    rows = [
        {"label": "torch B=8", "framework": "torch", "preset": "gpt2_xl", "batch_size": 8, "tokens_per_sec": 40_000.0,
         "step_time_s": 0.2, "tflops_per_device": 400.0, "mfu": 0.40, "peak_memory_gib": 47.0},
        {"label": "ours B=8", "framework": "jax", "preset": "gpt2_xl", "batch_size": 8, "tokens_per_sec": 42_000.0,
         "step_time_s": 0.19, "tflops_per_device": 420.0, "mfu": 0.42, "peak_memory_gib": 45.0},
        {"label": "ours B=12", "framework": "jax", "preset": "gpt2_xl", "batch_size": 12, "tokens_per_sec": 44_000.0,
         "step_time_s": 0.28, "tflops_per_device": 440.0, "mfu": 0.44, "peak_memory_gib": 66.0},
        {"label": "ours B=16 remat=minimal", "note": "timed out"},
    ]
    table = benchmark_gpu.train_table(rows)
    assert "| ours B=8 | 42,000 | 190.0 | 420.0 | 42.0% | 45.0 | 1.05 |  |" in table
    assert "| ours B=12 | 44,000 | 280.0 | 440.0 | 44.0% | 66.0 | - |  |" in table  # no torch row at B=12
    assert "| ours B=16 remat=minimal | | | | | | | timed out |" in table
    assert table[-1] == ("Best: torch torch B=8 at 40,000 tokens/s; jax ours B=12 at 44,000 tokens/s; "
                         "ratio of bests 1.10")
