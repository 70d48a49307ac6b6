"""Megatron-LM runs of Llama-class models migrate to the llama family: every llama preset, written as Megatron's
flags, comes back as that preset with nothing left over; launch scripts written as Megatron-LM's examples write
them (tests/data/megatron_llama, SOURCE.md) give, through `python -m t5x_like.train --print_config`, every
architecture field of the llama3_8b and qwen2_0_5b presets; Megatron's defaults (tied output layer, biases, one
key/value group) and flags without an equivalent are said in the gin file; and a tiny Llama's script trains two
steps through the train CLI as migrated, from a working directory of its own with its relative paths."""
import dataclasses
import json
import math
import pydoc_data.topics
import shutil
from pathlib import Path

import numpy as np
import pytest

from configs import llama as llama_presets
from t5x_like.errors import UserError
from t5x_like.migration import translate, upstream
from tests.support.cli import run_cli
from tests.support.migration import (RUN, megatron_flags, megatron_token_file, migrated, page_script_migrated,
                                     preset_config, printed_config, stand_in_tokenizer)
from tests.support.shared_data import shared_file

SCRIPTS = Path(__file__).resolve().parents[2] / "data" / "megatron_llama"
@pytest.mark.parametrize("preset", llama_presets.PRESETS)
def test_a_presets_megatron_flags_come_back_as_the_preset(tmp_path, preset):
    out = migrated(tmp_path, megatron_flags(preset))
    assert out.value("model_config.preset") == preset
    assert out.overrides == {}
    assert out.skipped == []


def resolved(out: translate.Out) -> dict:
    """The migrated model config: its preset (model_config.preset) and overrides."""
    overrides = {name: value for name, (value, _) in out.overrides.items()}
    return dataclasses.asdict(preset_config(out.value("model_config.preset"))) | overrides


def without(flags: list[str], *names: str) -> list[str]:
    """The flags less `names`, each with the value that follows it (if any)."""
    kept, skip = [], False
    for flag in flags:
        if flag in names:
            skip = True
        elif skip and not flag.startswith("--"):
            skip = False
        else:
            kept.append(flag)
            skip = False
    return kept


def skipped(out: translate.Out) -> str:
    return "\n".join(f"{what}: {reason}" for what, reason in out.skipped)


def test_megatrons_defaults_tie_the_output_layer_and_bias_every_layer(tmp_path):
    out = migrated(tmp_path, without(megatron_flags("llama3_8b"), "--untie-embeddings-and-output-weights",
                                     "--disable-bias-linear"))
    assert out.value("model_config.preset") == "llama2_7b" and resolved(out)["tie_word_embeddings"] is True
    assert "Megatron's output layer is the input embedding" in out.overrides["tie_word_embeddings"][1]
    assert resolved(out)["qkv_bias"] is True
    assert "--disable-bias-linear not set: Megatron-LM's default: Megatron adds biases to every linear layer; the " \
           "llama family has them on query, key and value only" in skipped(out)


def test_query_groups_are_read_only_with_group_query_attention(tmp_path):
    flags = megatron_flags("llama3_8b")
    out = migrated(tmp_path, without(flags, "--group-query-attention"))
    assert resolved(out)["num_key_value_heads"] is None
    assert "--num-query-groups 8 (" in skipped(out) and "only with --group-query-attention" in skipped(out)
    out = migrated(tmp_path, without(flags, "--num-query-groups"))
    assert resolved(out)["num_key_value_heads"] == 1


def test_the_family_is_the_one_whose_architecture_the_flags_describe(tmp_path):
    flags = megatron_flags("llama3_8b")
    out = migrated(tmp_path, without(flags, "--swiglu"))
    assert resolved(out)["family"] == "llama"
    assert "--swiglu not set: Megatron-LM's default: the llama family has a SwiGLU MLP" in skipped(out)
    out = migrated(tmp_path, ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
                              "--seq-length", "32", "--max-position-embeddings", "32", "--swiglu", *RUN])
    assert resolved(out)["family"] == "gpt2"
    assert "the gpt2 family has a GELU MLP; this model differs from upstream's here" in skipped(out)


def test_flags_without_an_equivalent_are_listed_with_the_reason(tmp_path):
    out = migrated(tmp_path, megatron_flags("mistral_7b") + [
        "--rotary-percent", "0.5", "--rotary-interleaved", "--qk-layernorm", "--apply-layernorm-1p",
        "--window-attn-skip-freq", "4", "--kv-channels", "64", "--tokenizer-type", "TikTokenizer",
        "--tokenizer-model", "tokenizer.model", "--vocab-size", "131072"])
    listed = skipped(out)
    for flag, reason in (("--rotary-percent 0.5", "the llama family rotates whole heads"),
                         ("--rotary-interleaved", "not interleaved pairs"),
                         ("--qk-layernorm", "no query / key norm"),
                         ("--apply-layernorm-1p", "the same function"),
                         ("--window-attn-skip-freq 4", "every layer has the window here"),
                         ("--kv-channels 64", "heads here are hidden size / heads = 128 wide"),
                         ("--tokenizer-type TikTokenizer", "tiktoken files (a tokenizer.model of base64 tokens "
                                                           "and their ranks) have no reader here"),
                         ("--tokenizer-model tokenizer.model", "set TOKENIZER to the model's tokenizer.json")):
        assert f"{flag} (" in listed and reason in listed, flag
    assert out.value("TOKENIZER") is None and out.overrides["vocab_size"][0] == 131072


@pytest.mark.parametrize("flag, value, message", [
    ("--group-query-attention", "8", r"args.txt:1: --group-query-attention '8' is not true or false"),
    ("--window-size", "4096", r"args.txt:1: --window-size '4096' is not two whole numbers LEFT,RIGHT; fix the value "
                              r"\(Mistral's 4096-token window: 4095,0\)."),
])
def test_a_flag_written_wrong_is_named_in_one_line(tmp_path, flag, value, message):
    """Megatron-LM's docs/llama_mistral.md writes `--group-query-attention 8`, which its argparse refuses too."""
    flags = without(megatron_flags("llama3_8b"), "--group-query-attention")
    with pytest.raises(UserError, match=message):
        migrated(tmp_path, flags + [flag, value])


def test_megatron_lms_own_llama3_example_migrates(tmp_path, monkeypatch):
    """examples/llama/train_llama3_8b_h100_fp8.sh as upstream writes it (tests/data/upstream): its mock-data branch
    (NullTokenizer, --vocab-size), its rotary base of 1000000, its quoted `'99,1,0'` split and its FP8 recipe; every
    flag it sets is migrated or listed with a reason (none is left unrecognised)."""
    name = "train_llama3_8b_h100_fp8.sh"
    shutil.copy(SCRIPTS.parent / "upstream" / "megatron" / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    out = translate.translate(upstream.read([name]))
    config = resolved(out)
    assert (config["family"], config["rope_theta"], config["num_key_value_heads"]) == ("llama", 1e6, 8)
    assert config["vocab_size"] == 128256 and out.value("DATA_SPLIT") == "99,1,0"
    listed = skipped(out)
    for flag in ("--mock-data", "--tokenizer-type NullTokenizer", "--apply-layernorm-1p", "--use-mcore-models",
                 "--fp8-param-gather", "--context-parallel-size 1", "--decoupled-lr 5.0e-4", "--ckpt-format torch_dist"):
        assert f"{flag} ({name}:" in listed, flag
    assert "not recognised" not in listed, [line for line in listed.splitlines() if "not recognised" in line]
    assert out.value("model_config.matmul_dtype") == "fp8"  # its DTYPE="fp8" branch: --fp8-format hybrid


SCRIPT_CASES = {
    "train_llama3_8b.sh": dict(preset="llama3_8b", tokenizer="Meta-Llama-3-8B", expected={
        "TENSOR_PARALLEL": 2, "BATCH_SIZE": 512, "MICRO_BATCH_SIZE": 1, "TRAIN_STEPS": 100000,
        "make_optimizer.decay_steps": 100000, "WARMUP_STEPS": 2000, "make_optimizer.b2": 0.95,
        "make_optimizer.eps": 1e-5, "make_optimizer.min_learning_rate": 3e-5, "DTYPE": "bfloat16",
        "RULES": "zero1_tensor", "SEQ_LEN": 8192, "MODEL_DIR": "checkpoints/llama3_8b", "DATA_SPLIT": "99,1,0",
        "DATA_PATH": "data/fineweb_llama3_text_document", "train.tensorboard_dir": "tensorboard_logs/llama3_8b"}),
    "train_qwen2_0_5b.sh": dict(preset="qwen2_0_5b", tokenizer="Qwen2-0.5B", expected={
        "BATCH_SIZE": 256, "MICRO_BATCH_SIZE": 4, "accumulated": 256 // (4 * 8), "TRAIN_STEPS": math.ceil(25600000 / 256),
        "make_optimizer.decay_steps": math.ceil(25600000 / 256), "WARMUP_STEPS": math.ceil(256000 / 256),
        "SEQ_LEN": 4096, "DATA_SPLIT": "98,2,0", "model.dropout_rate": 0.1, "model.attention_dropout_rate": 0.1}),
}


@pytest.mark.parametrize("script", sorted(SCRIPT_CASES))
@pytest.mark.system
def test_a_megatron_llama_script_gives_the_presets_architecture(tmp_path, script):
    case = SCRIPT_CASES[script]
    shutil.copy(SCRIPTS / script, tmp_path / script)
    run_cli("t5x_like.migrate", [script, "--output=run.gin"], tmp_path)
    gin_text = (tmp_path / "run.gin").read_text()
    assert f"model_config.preset = '{case['preset']}'  # the llama family; upstream's shape is this preset's" \
        in gin_text
    assert "not recognised by this migration" not in gin_text, gin_text.split("# ---- not migrated")[-1]
    preset = preset_config(case["preset"])
    stand_in_tokenizer(tmp_path / case["tokenizer"], preset.vocab_size)
    values = printed_config(run_cli("t5x_like.train", ["--gin_file=run.gin", "--print_config"], tmp_path).stdout)
    architecture = preset.architecture()
    assert {k: values.get(f"model.{k}", "(not shown)") for k in architecture} == architecture
    for key, value in case["expected"].items():
        assert values.get(key, "(not shown)") == (pytest.approx(value) if isinstance(value, float) else value), key


@pytest.mark.system
def test_a_tiny_llama_script_trains_as_migrated(tmp_path):
    """T5's sentencepiece model stands in for Llama 2's tokenizer (the test skips without it)."""
    spiece = shared_file("t5-spiece", "spiece.model")
    shutil.copy(SCRIPTS / "pretrain_llama_tiny.sh", tmp_path)
    shutil.copy(spiece, tmp_path / "tokenizer.model")
    megatron_token_file(tmp_path / "data" / "tiny_text_document", tmp_path / "tokenizer.model")
    run_cli("t5x_like.migrate", ["pretrain_llama_tiny.sh", "--output=tiny.gin"], tmp_path)
    assert "# ---- not migrated" not in (tmp_path / "tiny.gin").read_text()
    run_cli("t5x_like.train", ["--gin_file=tiny.gin"], tmp_path, devices=2, timeout=600)
    run = tmp_path / "checkpoints" / "llama_tiny"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert len(losses) == 2 and all(np.isfinite(losses))
    from t5x_like.checkpoint import store
    from t5x_like.data.tokenizer import load_tokenizer

    config = store.read_model_info(str(run))["config"]
    assert {k: config[k] for k in ("family", "num_layers", "embed_dim", "num_key_value_heads", "rope_theta",
                                   "tie_word_embeddings", "qkv_bias", "vocab_size")} == dict(
        family="llama", num_layers=2, embed_dim=64, num_key_value_heads=2, rope_theta=500000.0,
        tie_word_embeddings=False, qkv_bias=False, vocab_size=load_tokenizer(tmp_path / "tokenizer.model").vocab_size)


def test_the_migration_page_shows_this_script_and_what_it_migrates_to(tmp_path):
    """docs/migrating.md's Llama 3 8B script is the one tested above, and its gin excerpt is the migration's."""
    script, excerpt, written = page_script_migrated("train_llama3_8b.sh", tmp_path)
    assert script == (SCRIPTS / "train_llama3_8b.sh").read_text()
    assert [line for line in excerpt if line not in written] == []


FP8 = ["--fp8-format", "hybrid", "--fp8-amax-history-len", "1024", "--fp8-amax-compute-algo", "max",
       "--fp8-param-gather"]


@pytest.mark.system
def test_megatrons_fp8_recipe_turns_on_the_fp8_matmuls(tmp_path):
    """Transformer Engine's recipe as Megatron-LM's examples set it (hybrid, delayed scaling over a 1024-step amax
    history, its max) is the recipe of `matmul_dtype='fp8'` here: the gin file sets it, says where it came from,
    and `train --print_config` resolves it."""
    flags = megatron_flags("llama_tiny") + FP8 + ["--bf16", "--save", "runs/fp8", "--data-path", "data/text_document",
                                                  "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok"]
    (tmp_path / "args.txt").write_text(" ".join(flags) + "\n")
    stand_in_tokenizer(tmp_path / "tok", preset_config("llama_tiny").vocab_size)
    run_cli("t5x_like.migrate", ["args.txt", "--output=run.gin"], tmp_path)
    gin_text = (tmp_path / "run.gin").read_text()
    assert "model_config.matmul_dtype = 'fp8'  # --fp8-format hybrid (args.txt:1)" in gin_text
    assert "not recognised by this migration" not in gin_text, gin_text.split("# ---- not migrated")[-1]
    assert "--fp8-param-gather (args.txt:1): parameters are stored and gathered in their own dtype" in gin_text
    values = printed_config(run_cli("t5x_like.train", ["--gin_file=run.gin", "--print_config"], tmp_path).stdout)
    assert (values["model.matmul_dtype"], values["DTYPE"]) == ("fp8", "bfloat16")


def test_fp8_settings_that_differ_here_are_listed_and_a_pipeline_keeps_its_dtype(tmp_path):
    flags = megatron_flags("llama_tiny") + ["--fp8-format", "e4m3", "--fp8-recipe", "tensorwise",
                                            "--fp8-amax-history-len", "16", "--fp8-amax-compute-algo", "most_recent"]
    out = migrated(tmp_path, flags)
    why = next(binding.why for binding in out.bindings if binding.name == "model_config.matmul_dtype")
    assert out.value("model_config.matmul_dtype") == "fp8" and "E5M2 here" in why
    listed = skipped(out)
    for flag, reason in (("--fp8-recipe tensorwise", "fixed at recipe 'delayed'"),
                         ("--fp8-amax-history-len 16", "fixed at amax history len 1024"),
                         ("--fp8-amax-compute-algo most_recent", "fixed at amax compute algo 'max'")):
        assert f"{flag} (" in listed and reason in listed, flag
    pipelined = migrated(tmp_path, flags + ["--pipeline-model-parallel-size", "2"])
    assert pipelined.value("model_config.matmul_dtype") is None
    assert "args.txt:1): FP8 matmuls do not run pipelined here yet" in skipped(pipelined)
    assert "--fp8-format e4m3 (" in skipped(pipelined) and "--fp8-amax-history-len 16 (" in skipped(pipelined)
    unused = skipped(migrated(tmp_path, megatron_flags("llama_tiny") + ["--fp8-amax-history-len", "16"]))
    assert "--fp8-amax-history-len 16 (" in unused and "FP8 is off upstream (no --fp8-format)" in unused
