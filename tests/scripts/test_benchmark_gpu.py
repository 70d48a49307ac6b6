"""The GPU suite driver's own logic, on a CPU: run lists, flag choices (each entry's environment and command), the
fp8 item, tables and the profile's busy time."""
import argparse
import json

import pytest

import configs
import models
from scripts import benchmark_gpu, benchmark_gpu_report, benchmark_train


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
    assert benchmark_gpu_report.busy_union([(0, 10), (5, 15), (20, 30), (25, 26)]) == 25
    assert benchmark_gpu_report.busy_union([]) == 0


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
    table = benchmark_gpu_report.train_table(rows)
    assert "| ours B=8 | 42,000 | 190.0 | 420.0 | 42.0% | 45.0 | 1.05 |  |" in table
    assert "| ours B=12 | 44,000 | 280.0 | 440.0 | 44.0% | 66.0 | - |  |" in table  # no torch row at B=12
    assert "| ours B=16 remat=minimal | | | | | | | timed out |" in table
    assert table[-1] == ("Best: torch torch B=8 at 40,000 tokens/s; jax ours B=12 at 44,000 tokens/s; "
                         "ratio of bests 1.10")


@pytest.mark.parametrize("name", [n for n in benchmark_gpu.FLAG_VARIANTS if n != "default"])
@pytest.mark.system
def test_every_flag_entry_builds_its_environment_and_command(name, tmp_path):
    args = benchmark_gpu.parse_args([f"--out={tmp_path}", "--only=flags", f"--flags={name}"])
    assert args.flags == (name,)
    xla_flags, settings = benchmark_gpu.flag_variant(name)
    assert xla_flags == benchmark_gpu.FLAG_VARIANTS[name].get("xla_flags", "")
    assert all(flag.startswith("--xla_gpu_") for flag in xla_flags.split())
    recorder = benchmark_gpu.Recorder(str(tmp_path), benchmark_gpu.SMOKE, {"overrides": {"scan_layers": False}})
    argv = benchmark_gpu.ours_argv(recorder, benchmark_gpu.SMOKE, "row.json", preset="gpt2_tiny", batch=2, **settings)
    overrides = json.loads(next(a for a in argv if a.startswith("--overrides=")).split("=", 1)[1])
    assert overrides["scan_layers"] is False  # the suite's own settings stay
    assert overrides.get("matmul_dtype") == benchmark_gpu.FLAG_VARIANTS[name].get("overrides", {}).get("matmul_dtype")
    chunk = benchmark_gpu.FLAG_VARIANTS[name].get("loss_chunk_size")
    assert (f"--loss_chunk_size={chunk}" in argv) == (chunk is not None)
    # benchmark_train.py accepts what the driver passes
    train_args = benchmark_train.parse_args(argv[1:])
    assert train_args.loss_chunk_size == (chunk or 256)
    models.config_from_dict({**configs.get_model_config("gpt2_tiny").to_dict(), **json.loads(train_args.overrides)})


def test_flags_combine_with_ampersand():
    args = benchmark_gpu.parse_args(["--out=/tmp/unused",
                                     "--flags=cublaslt&cudnn layer norm&fp8 matmuls&loss chunk 512"])
    xla_flags, settings = benchmark_gpu.flag_variant(args.flags[0])
    assert xla_flags == "--xla_gpu_enable_cublaslt=true --xla_gpu_enable_cudnn_layer_norm=true"
    assert settings == {"overrides": {"matmul_dtype": "fp8"}, "loss_chunk_size": 512}
    with pytest.raises(SystemExit):
        benchmark_gpu.parse_args(["--out=/tmp/unused", "--flags=cublaslt&fast"])


@pytest.mark.system
def test_fp8_item_runs_torch_bf16_and_fp8_for_the_loss_steps(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(benchmark_gpu, "timed_row", lambda recorder, item, label, argv, path, timeout, env=None:
                        calls.append((label, argv)) or {})
    recorder = benchmark_gpu.Recorder(str(tmp_path), benchmark_gpu.FULL, {"overrides": {"scan_layers": False}})
    benchmark_gpu.item_fp8(recorder, benchmark_gpu.FULL, str(tmp_path), lambda cap: cap)
    assert [label for label, _ in calls] == [
        "torch gpt2_small B=16", "ours gpt2_small B=16 bf16", "ours gpt2_small B=16 fp8",
        "torch gpt2_xl B=8", "ours gpt2_xl B=8 bf16", "ours gpt2_xl B=8 fp8"]
    assert all("--steps=200" in argv for _, argv in calls)
    assert all(('"matmul_dtype": "fp8"' in " ".join(argv)) == label.endswith("fp8") for label, argv in calls)


def test_loss_table_compares_first_and_final_losses():
    rows = [{"label": "ours gpt2_small B=16 fp8", "steps": 200, "first_loss": 11.0123, "final_loss": 3.25},
            {"label": "torch gpt2_small B=16", "note": "timed out"}]
    assert benchmark_gpu_report.loss_table(rows)[2] == "| ours gpt2_small B=16 fp8 | 200 | 11.0123 | 3.2500 |"


def test_fp8_runs_and_loss_steps_replace_the_suites():
    args = benchmark_gpu.parse_args(["--out=/tmp/unused", "--only=fp8", "--fp8_runs=gpt2_xl:8", "--loss_steps=50"])
    assert args.fp8_runs == (("gpt2_xl", 8),) and args.loss_steps == 50
    with pytest.raises(argparse.ArgumentTypeError, match="preset:batch"):
        benchmark_gpu.parse_presets("gpt2_xl")


@pytest.mark.system
def test_tune_item_retries_with_serial_compiles_and_reports_the_table(tmp_path, monkeypatch):
    """A tuning child that dies before writing anything (a crash in the parallel compiles) is run again with
    --workers=1; its rows become the attention table and the tuned-launch table of results.md."""
    calls = []
    entry = {"head_dim": 64, "length": 2048, "fastest": "cudnn", "fwd_bwd_ms": {"cudnn": 1.6, "pallas": 2.3},
             "tuning": {name: {"block_q": 128, "block_k": 64, "num_warps": 8, "num_stages": 3}
                        for name in ("forward", "dq", "dkv")}}
    row = {"impl": "cudnn", "mode": "fwd+bwd", "length": 2048, "head_dim": 64, "tflops": 292.0, "temp_bytes": 0}

    def run_child(recorder, argv, timeout, env=None):
        calls.append(argv)
        if len(calls) == 2:
            rows = next(a.split("=", 1)[1] for a in argv if a.startswith("--json="))
            with open(rows, "w") as f:
                json.dump({"source": {"device": "NVIDIA H200", "jax": "0.11.2", "dtype": "bfloat16", "tokens": 16384,
                                      "hidden": 2048}, "compare": [row], "entries": [entry], "kernels": [],
                           "skipped": ["D=64 T=4096"]}, f)
        return (-11 if len(calls) == 1 else 0), ""

    monkeypatch.setattr(benchmark_gpu, "run_child", run_child)
    recorder = benchmark_gpu.Recorder(str(tmp_path), benchmark_gpu.FULL, {})
    benchmark_gpu.item_tune(recorder, benchmark_gpu.FULL, str(tmp_path), lambda cap: cap)
    assert not any(a.startswith("--workers") for a in calls[0]) and "--workers=1" in calls[1]
    report = benchmark_gpu_report.markdown(recorder.results)
    assert "| fwd+bwd | 2048 | 64 | 292 (0) | cudnn |" in report
    assert "| 64 | 2048 | 128x64 w8 s3 | 128x64 w8 s3 | 128x64 w8 s3 | cudnn 1.600, pallas 2.300 | cudnn |" in report
    assert "Not tuned (out of time): D=64 T=4096" in report


def test_the_headline_plan_runs_small_xl_and_moe_and_reads_four_figures():
    args = benchmark_gpu.parse_args(["--out=/tmp/unused", "--plan=headline", "--headline=h.json"])
    assert args.only == ["small", "xl", "moe"] and args.headline == "h.json"
    results = {"environment": {"nvidia-smi": "NVIDIA H200, 570.1, 143771 MiB", "jax": "0.11.0"}, "command": "x",
               "items": {
                   "small": [{"label": "torch B=16", "framework": "torch", "batch_size": 16, "tokens_per_sec": 400.0},
                             {"label": "ours B=16", "framework": "jax", "batch_size": 16, "tokens_per_sec": 500.0,
                              "mfu": 0.42},
                             {"label": "ours B=16 scan_layers=True", "framework": "jax", "batch_size": 16,
                              "tokens_per_sec": 900.0, "mfu": 0.9}],
                   "xl": [{"label": "ours B=8", "framework": "jax", "mfu": 0.48}, {"label": "torch B=8",
                          "framework": "torch", "mfu": 0.6}, {"label": "ours B=16", "note": "timed out"}],
                   "moe": [{"variant": "dense, same active parameters", "vs_dense": 1.0},
                           {"variant": "MoE, dropless", "vs_dense": 0.74},
                           {"variant": "MoE, capacity factor 1.25", "vs_dense": 0.8}]}}
    figures = benchmark_gpu.headline.headline(results)
    assert figures["device"].startswith("NVIDIA H200")
    assert figures["gpt2_124m"] == {"tokens_per_s": 500.0, "mfu": 0.42, "vs_torch": 1.25}  # not a variant's row
    assert figures["gpt2_1_5b"] == {"mfu": 0.48} and figures["moe"] == {"vs_dense_same_active": 0.74}


@pytest.mark.system
def test_a_smoke_headline_run_on_cpu_writes_the_file(tmp_path):
    """The prepared check's wiring on a CPU (tiny shapes; the 1.5B item left out for time): the 124M pair and the
    MoE rows run in children and the headline file holds their figures."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.support.environment import cpu_env

    script = Path(benchmark_gpu.__file__)
    done = subprocess.run([sys.executable, str(script), "--out=out", "--smoke", "--plan=headline", "--only=small,moe",
                           "--headline=gpu/headline.json"], cwd=tmp_path, env=cpu_env(1), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads((tmp_path / "gpu" / "headline.json").read_text())
    assert figures["gpt2_124m"]["tokens_per_s"] > 0 and figures["gpt2_124m"]["vs_torch"] > 0
    assert figures["moe"]["vs_dense_same_active"] > 0 and figures["gpt2_1_5b"] == {"mfu": None}
    assert "## moe" in (tmp_path / "out" / "results.md").read_text()
