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


def test_flops_are_6n_plus_causal_attention_from_the_baselines_own_count(rows):
    """Both rows' FLOPs against a count taken from the PyTorch module itself, not from the config's
    formula: 6 FLOPs (forward 2, backward 4) per token per weight it multiplies with (the baseline's
    own parameter count less the position table, biases and norms, which no token multiplies with;
    the tied head counts over the real vocabulary) plus causal attention: QK^T and AV are 2·T²·d
    each over the full square, half of it causal, 3x for forward + backward = 6·T²·d per block."""
    ours, torch_row = rows
    model = benchmark_torch.GPT(benchmark_torch.model_config(PRESET, OVERRIDES))
    unmultiplied = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 1 or name.startswith("wpe."))
    weights = torch_row["num_params"] - unmultiplied
    blocks, width, length = len(model.blocks), model.wte.embedding_dim, torch_row["seq_len"]
    per_row = 6 * weights * length + 6 * blocks * length**2 * width
    for row in (torch_row, ours):
        reported = row["tflops_per_device"] * 1e12 * row["devices"] * row["step_time_s"]
        assert reported == pytest.approx(per_row * row["batch_size"], rel=1e-9), row["framework"]
        assert row["tokens_per_sec"] > 0


def test_ratios():
    ours = {"tokens_per_sec": 300.0, "peak_memory_gib": 2.0}
    reference = {"tokens_per_sec": 200.0, "peak_memory_gib": None}
    assert benchmark_train.ratios(ours, reference) == {"tokens_per_sec": 1.5, "peak_memory": None}
