"""The PyTorch reference and our benchmark run the same GPT-2 on a tiny shape (CPU, eager torch)."""
import math

import pytest

pytest.importorskip("torch")

from scripts import benchmark_torch, benchmark_train  # noqa: E402

PRESET, OVERRIDES = "gpt2_tiny", {"num_layers": 2}


@pytest.fixture(scope="module")
def rows():
    args = benchmark_train.parse_args([f"--preset={PRESET}", '--overrides={"num_layers": 2}', "--batch_size=8",
                                       "--seq_len=32", "--steps=2", "--warmup=1", "--dtype=float32"])
    ours = benchmark_train.measure(args)
    torch_row = benchmark_torch.measure(preset=PRESET, overrides=OVERRIDES, batch_size=8, seq_len=32, steps=2,
                                        warmup=1, dtype="float32", compile_model=False)
    return ours, torch_row


def test_same_parameter_count(rows):
    ours, torch_row = rows
    assert ours["num_params"] == torch_row["num_params"] > 0


def test_first_loss_near_uniform(rows):
    vocab = benchmark_torch.model_config(PRESET, OVERRIDES).vocab_size
    for row in rows:  # init std 0.02: logits' std ~0.02·sqrt(256) = 0.32, so loss ~ ln(vocab) + 0.32²/2
        assert abs(row["first_loss"] - math.log(vocab)) < 0.15, row["framework"]
        assert row["final_loss"] < row["first_loss"], row["framework"]  # the optimizer steps


def test_same_flops_formula(rows):
    ours, torch_row = rows
    flops = lambda r: r["tflops_per_device"] * r["devices"] * r["step_time_s"]  # noqa: E731
    assert flops(ours) == pytest.approx(flops(torch_row), rel=1e-9)
    assert ours["tokens_per_sec"] > 0 and torch_row["tokens_per_sec"] > 0


def test_ratios():
    ours = {"tokens_per_sec": 300.0, "peak_memory_gib": 2.0}
    reference = {"tokens_per_sec": 200.0, "peak_memory_gib": None}
    assert benchmark_train.ratios(ours, reference) == {"tokens_per_sec": 1.5, "peak_memory": None}
