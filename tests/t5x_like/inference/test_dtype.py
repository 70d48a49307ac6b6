"""The compute dtype of eval and generate: a float16/bfloat16 checkpoint computes in float32 on CPU (which only
emulates the half types, more slowly) and the CLI says so in one line; --dtype overrides; elsewhere the
recorded dtype stays. Run as users run it: the CLIs in a working directory of their own, relative paths."""
import argparse
import json
import shutil
from pathlib import Path

import pytest

from t5x_like.inference import loading
from tests.support.cli import run_cli
from tests.support.shared_data import shared_file

NOTE = "compute dtype: float32 (checkpoint {} records float16, which CPUs only emulate"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory with one small random GPT-2 (the builtin corpus's tokenizer) converted twice: fp16/ records
    float16, fp32/ float32 (the same float32 weights); and wiki.txt, the start of WikiText-103's test set."""
    torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
    from t5x_like.convert import hf
    from t5x_like.data.builtin import builtin_corpus

    path = tmp_path_factory.mktemp("dtype")
    _, tokenizer = builtin_corpus()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=8192, n_positions=64, n_embd=64, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    with torch.no_grad():  # far from uniform predictions, so float16 arithmetic moves the perplexity
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(path / "hf")
    shutil.copyfile(tokenizer, path / "hf" / "tokenizer.json")
    for dtype in ("float16", "float32"):
        hf.from_hf(str(path / "hf"), str(path / f"fp{dtype[-2:]}"), dtype=dtype)
    lines = shared_file("wikitext", "wt103-tokenized", "wiki.test.tokens").read_text(encoding="utf-8").splitlines()
    (path / "wiki.txt").write_text("\n".join(lines[:30]) + "\n", encoding="utf-8")
    return path


@pytest.mark.system
def test_a_float16_checkpoint_evaluates_in_float32_on_cpu_and_says_so(workdir):
    """The same perplexity as its float32 copy within 1e-6 (relative): the same float32 weights, computed alike;
    --dtype=float16 computes in float16 (no note), which moves it by more than that (3e-5 here)."""
    results = {}
    for name, extra in (("fp16", []), ("fp32", []), ("fp16", ["--dtype=float16"])):
        output = f"{name}{''.join(extra)}.json"
        done = run_cli("t5x_like.eval", ["--task=wikitext", f"--checkpoint={name}", "--data=wiki.txt",
                                         "--seq_len=64", "--stride=32", "--batch_size=4", f"--output={output}", *extra],
                       workdir, devices=1)
        notes = [line for line in done.stderr.splitlines() if line.startswith("compute dtype:")]
        assert notes == ([NOTE.format(name) + ", more slowly; --dtype=float16 keeps it)"]
                         if name == "fp16" and not extra else []), done.stderr[-2000:]
        results[name, bool(extra)] = json.loads((workdir / output).read_text())["ppl"]
    assert results["fp16", False] == pytest.approx(results["fp32", False], rel=1e-6)
    assert results["fp16", True] != pytest.approx(results["fp32", False], rel=1e-6)
    assert results["fp16", True] == pytest.approx(results["fp32", False], rel=1e-3)


@pytest.mark.system
def test_generate_says_it_too_and_decodes_as_the_float32_copy(workdir):
    out = {}
    for name in ("fp16", "fp32"):
        done = run_cli("t5x_like.generate", [f"--checkpoint={name}", "--prompt=The list type", "--max_new_tokens=8",
                                             "--temperature=0"], workdir, devices=1)
        assert (NOTE.format(name) in done.stderr) == (name == "fp16"), done.stderr[-2000:]
        out[name] = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert out["fp16"] == out["fp32"] and len(out["fp16"]) == 1


def flags(checkpoint: Path, dtype: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(checkpoint=str(checkpoint), dtype=dtype)


def test_dtype_flag_overrides_and_other_devices_keep_the_recorded_dtype(workdir, monkeypatch, capsys):
    assert loading.compute_config(flags(workdir / "fp16"), announce=True).dtype == "float32"
    assert NOTE.format(workdir / "fp16") in capsys.readouterr().err
    assert loading.compute_config(flags(workdir / "fp16", "float16"), announce=True).dtype == "float16"
    assert loading.compute_config(flags(workdir / "fp32", "bfloat16"), announce=True).dtype == "bfloat16"
    monkeypatch.setattr(loading.jax, "default_backend", lambda: "gpu")
    assert loading.compute_config(flags(workdir / "fp16"), announce=True).dtype == "float16"
    assert "compute dtype" not in capsys.readouterr().err
