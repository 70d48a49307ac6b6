"""`python -m t5x_like.migrate` on upstream configurations as written upstream (tests/data/upstream, SOURCE.md),
then `python -m t5x_like.train --print_config` on the gin file it writes, as a user runs them: every value the
upstream files set is the value the run here uses, and every upstream setting is either checked here or listed
in the gin file as not migrated. The expected values are read off the upstream files by hand (below), not
computed by the migration's code."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.environment import cpu_env
from tests.support.migration import printed_config
from tests.support.shared_data import shared_file

pytestmark = pytest.mark.system

UPSTREAM = Path(__file__).resolve().parents[2] / "data" / "upstream"

# upstream name -> {what --print_config shows: expected value}; {} = read, consistent with the others checked
CPM_COMMON = {
    "--model-parallel-size": {"TENSOR_PARALLEL": 2}, "--num-layers": {"model.num_layers": 2},
    "--kv-hidden-size": {}, "--batch-size": {}, "--gas": {},
    "--train-iters": {"TRAIN_STEPS": 320000}, "--lr-decay-iters": {"make_optimizer.decay_steps": 320000},
    "--split": {"DATA_SPLIT": "949,50,1"}, "--lr": {"LEARNING_RATE": 1.5e-4},
    "--lr-decay-style": {"make_optimizer.decay": "cosine"}, "--min-lr": {"make_optimizer.min_learning_rate": 1e-5},
    "--weight-decay": {"make_optimizer.weight_decay": 1e-2}, "--clip-grad": {"make_optimizer.clip_grad_norm": 1.0},
    "--warmup": {"WARMUP_STEPS": 0.01}, "--log-interval": {"train.log_every": 1},
    "--save-interval": {"CHECKPOINT_EVERY": 500}, "--eval-interval": {"EVAL_EVERY": 100},
    "--eval-iters": {"EVAL_STEPS": 10}, "--fp16": {"DTYPE": "float16", "model.dtype": "float16"},
    "--deepspeed_config": {}, "train_micro_batch_size_per_gpu": {}, "steps_per_print": {},
    "gradient_clipping": {"make_optimizer.clip_grad_norm": 1.0}, "fp16.enabled": {"DTYPE": "float16"},
    "fp16.loss_scale": {"LossScaleConfig.static_scale": 0.0}, "fp16.loss_scale_window": {"LossScaleConfig.window": 1000},
    "fp16.hysteresis": {"LossScaleConfig.hysteresis": 2}, "fp16.initial_scale_power": {"LossScaleConfig.initial_scale_power": 16},
}
MEGATRON_DEFAULTS = {"make_optimizer.b1": 0.9, "make_optimizer.b2": 0.999, "make_optimizer.eps": 1e-8,
                     "make_optimizer.decay_embeddings": True, "SEED": 1234, "train.keep_checkpoints": None,
                     "OPTIMIZER": "adamw"}
NOT_PASSED = {"--zero-contigious-gradients", "--zero-reduce-scatter", "--checkpoint-num-layers",
              "--partition-activations", "--checkpoint-in-cpu", "--synchronize-each-layer",
              "--contigious-checkpointing", "--profile-backward", "--master_port", "--hostfile"}
"""Flags the CPM scripts write but never pass: inside `if` blocks whose tests are false (or that bash fails on),
and the deepspeed launcher's own."""

CASES = {
    "cpm_gpt2": dict(
        files=["cpm_pretrain/run_gpt2.sh", "--deepspeed_config=cpm_pretrain/ds_config_gpt2.json"],
        tokenizer=("home/gpt2_data/bpe_3w_new/vocab.json", "wordlevel"),
        expected={**CPM_COMMON, "--pipe-parallel-size": {"PIPELINE_PARALLEL": 2, "MICRO_BATCH_SIZE": 4},
                  "--hidden-size": {"model.embed_dim": 256}, "--num-attention-heads": {"model.num_heads": 16},
                  "--ff-hidden-size": {"model.mlp_dim": 1024}, "--seq-length": {"SEQ_LEN": 1024},
                  "--max-position-embeddings": {"model.max_len": 1024},
                  "--save": {"MODEL_DIR": "checkpoints/gpt2_345m_ds"},
                  "--data-path": {"DATA_PATH": "{home}/gpt2_data/CPM-train/data"},
                  "--vocab-file": {"TOKENIZER": "{home}/gpt2_data/bpe_3w_new/vocab.json"},
                  "--checkpoint-activations": {"model.remat_policy": "full"},
                  "--tensorboard-dir": {"train.tensorboard_dir": "tensorboard_data/2l_256h_1n_4g_2pp_2mp_4b_ds4"},
                  "train_batch_size": {"BATCH_SIZE": 64}},
        defaults={**MEGATRON_DEFAULTS, "model.dropout_rate": 0.1, "model.attention_dropout_rate": 0.1,
                  "model.init_std": 0.02, "GRAD_ACCUM_STEPS": 1, "NUM_MICROBATCHES": 1,
                  "model.family": "gpt2"}),
    "cpm_t5": dict(
        files=["cpm_pretrain/run_t5.sh", "--deepspeed_config=cpm_pretrain/ds_config_t5.json"],
        not_passed={"--checkpoint-activations"},
        tokenizer=("home/t5_data/bpe_new", "spiece"),
        expected={**CPM_COMMON, "--pipe-parallel-size": {"PIPELINE_PARALLEL": 1},
                  "--gas": {"MICRO_BATCH_SIZE": 4, "GRAD_ACCUM_STEPS": 1},
                  "--hidden-size": {"model.embed_dim": 128}, "--num-attention-heads": {"model.num_heads": 8},
                  "--kv-hidden-size": {"model.d_kv": 16}, "--ff-hidden-size": {"model.mlp_dim": 256},
                  "--enc-seq-length": {"FEATURE_LENGTHS": {"inputs": 1024, "targets": 384}},
                  "--dec-seq-length": {}, "--save": {"MODEL_DIR": "checkpoints/t5_test"},
                  "--data-path": {"DATA_PATH": "{home}/t5_data/pretrain_data/baike_small_document"},
                  "--vocab-file": {"TOKENIZER": "{home}/t5_data/bpe_new"},
                  "--tensorboard-dir": {"train.tensorboard_dir": "tensorboard_data/2l_128h_1n_4g_1pp_2mp_4b_ds4"},
                  "train_batch_size": {"BATCH_SIZE": 128}},
        defaults={**MEGATRON_DEFAULTS, "model.num_decoder_layers": 2, "model.dropout_rate": 0.1,
                  "model.tie_word_embeddings": True, "model.family": "t5", "OBJECTIVE": "span_corruption"}),
    "megatron_gpt2": dict(
        files=["megatron/pretrain_gpt2.sh"], tokenizer=("gpt2-vocab.json", "gpt2"),
        expected={"--num-layers": {"model.num_layers": 24}, "--hidden-size": {"model.embed_dim": 1024},
                  "--num-attention-heads": {"model.num_heads": 16},
                  "--batch-size": {"BATCH_SIZE": 8, "MICRO_BATCH_SIZE": 8},
                  "--seq-length": {"SEQ_LEN": 1024}, "--max-position-embeddings": {"model.max_len": 1024},
                  "--train-iters": {"TRAIN_STEPS": 500000}, "--lr-decay-iters": {"make_optimizer.decay_steps": 320000},
                  "--save": {}, "--load": {}, "--data-path": {},
                  "--vocab-file": {"TOKENIZER": "gpt2-vocab.json"}, "--merge-file": {},
                  "--split": {"DATA_SPLIT": "949,50,1"}, "--lr": {"LEARNING_RATE": 0.00015},
                  "--min-lr": {"make_optimizer.min_learning_rate": 1e-5},
                  "--lr-decay-style": {"make_optimizer.decay": "cosine"},
                  "--weight-decay": {"make_optimizer.weight_decay": 1e-2},
                  "--clip-grad": {"make_optimizer.clip_grad_norm": 1.0}, "--warmup": {"WARMUP_STEPS": 0.01},
                  "--checkpoint-activations": {"model.remat_policy": "full"}, "--log-interval": {"train.log_every": 100},
                  "--save-interval": {"CHECKPOINT_EVERY": 10000}, "--eval-interval": {"EVAL_EVERY": 1000},
                  "--eval-iters": {"EVAL_STEPS": 10}, "--fp16": {"DTYPE": "float16"}},
        defaults={**MEGATRON_DEFAULTS, "TENSOR_PARALLEL": 1, "PIPELINE_PARALLEL": 1, "GRAD_ACCUM_STEPS": 1,
                  "LossScaleConfig.initial_scale_power": 32, "LossScaleConfig.window": 1000,
                  "LossScaleConfig.hysteresis": 2, "LossScaleConfig.min_scale": 1.0, "model.family": "gpt2"},
        bindings=["--gin.MODEL_DIR='runs/megatron'", "--gin.DATA_PATH='my-gpt2_text_document'"]),
}
NEOX_COMMON = {
    "pipe_parallel_size": {"PIPELINE_PARALLEL": 1}, "model_parallel_size": {"TENSOR_PARALLEL": 1},
    "seq_length": {"SEQ_LEN": 2048}, "max_position_embeddings": {"model.max_len": 2048},
    "pos_emb": {"model.family": "neox"}, "rotary_pct": {"model.rotary_pct": 0.25},
    "no_weight_tying": {"model.family": "neox"}, "gpt_j_residual": {"model.use_parallel_residual": True},
    "init_method": {"model.init_std": None}, "output_layer_init_method": {"model.family": "neox"},
    "optimizer.type": {"OPTIMIZER": "adamw"}, "optimizer.params.betas": {"make_optimizer.b1": 0.9,
                                                                        "make_optimizer.b2": 0.95},
    "optimizer.params.eps": {"make_optimizer.eps": 1e-8}, "zero_optimization.stage": {"RULES": "zero1",
                                                                                     "FSDP_PARALLEL": -1},
    "checkpoint_activations": {"model.remat_policy": "full"}, "gradient_clipping": {"make_optimizer.clip_grad_norm": 1.0},
    "hidden_dropout": {"model.dropout_rate": 0.0}, "attention_dropout": {"model.attention_dropout_rate": 0.0},
    "fp16.fp16": {}, "fp16.enabled": {"DTYPE": "float16"}, "fp16.loss_scale": {"LossScaleConfig.static_scale": 0.0},
    "fp16.loss_scale_window": {"LossScaleConfig.window": 1000}, "fp16.initial_scale_power":
        {"LossScaleConfig.initial_scale_power": 12}, "fp16.hysteresis": {"LossScaleConfig.hysteresis": 2},
    "fp16.min_loss_scale": {"LossScaleConfig.min_scale": 1.0}, "lr_decay_style": {"make_optimizer.decay": "cosine"},
    "warmup": {"WARMUP_STEPS": 0.01}, "tokenizer_type": {}, "steps_per_print": {},
}
CASES["neox_20b"] = dict(
    files=["neox/20B.yml", "--num_gpus=96"], tokenizer=("20B_checkpoints/20B_tokenizer.json", "neox"),
    expected={**NEOX_COMMON, "vocab_file": {"TOKENIZER": "./20B_checkpoints/20B_tokenizer.json"},
              "save": {"MODEL_DIR": "./20B_checkpoints"}, "load": {"RESTORE_FROM": None},
              "data_path": {"DATA_PATH": "./data/pile_20B_tokenizer/pile_20B_tokenizer_text_document"},
              "pipe_parallel_size": {"PIPELINE_PARALLEL": 4, "MICRO_BATCH_SIZE": 4},
              "model_parallel_size": {"TENSOR_PARALLEL": 2}, "num_layers": {"model.num_layers": 44},
              "hidden_size": {"model.embed_dim": 6144}, "num_attention_heads": {"model.num_heads": 64},
              "norm": {"model.family": "neox"}, "optimizer.params.lr": {"LEARNING_RATE": 0.97e-4},
              "min_lr": {"make_optimizer.min_learning_rate": 0.97e-5},
              "zero_optimization.stage": {"RULES": "zero1_tensor", "FSDP_PARALLEL": -1},
              "train_micro_batch_size_per_gpu": {"BATCH_SIZE": 4 * 32 * 96 // 8},
              "gradient_accumulation_steps": {"GRAD_ACCUM_STEPS": 1, "NUM_MICROBATCHES": 1},
              "split": {"DATA_SPLIT": "995,4,1"},
              "weight_decay": {"make_optimizer.weight_decay": 0.01}, "train_iters": {"TRAIN_STEPS": 150000},
              "lr_decay_iters": {"make_optimizer.decay_steps": 150000}, "checkpoint_factor": {"CHECKPOINT_EVERY": 500},
              "eval_interval": {"EVAL_EVERY": 1000}, "eval_iters": {"EVAL_STEPS": 10},
              "log_interval": {"train.log_every": 2}, "tensorboard_dir": {"train.tensorboard_dir": "./tensorboard"}},
    defaults={"SEED": 1234, "train.keep_checkpoints": None, "model.rotary_base": 10000.0,
              "make_optimizer.decay_embeddings": True})
CASES["pythia_160m"] = dict(
    files=["neox/pythia/160M.yml", "neox/pythia/pythia-paths.yml", "--num_gpus=32"],
    tokenizer=("home/mchorse/data/tokenizers/20B_tokenizer.json", "neox"),
    expected={**NEOX_COMMON, "num_layers": {"model.num_layers": 12}, "hidden_size": {"model.embed_dim": 768},
              "num_attention_heads": {"model.num_heads": 12}, "optimizer.params.lr": {"LEARNING_RATE": 0.0006},
              "min_lr": {"make_optimizer.min_learning_rate": 0.00006},
              "train_micro_batch_size_per_gpu": {"BATCH_SIZE": 32 * 32, "MICRO_BATCH_SIZE": 32}, "weight_decay":
                  {"make_optimizer.weight_decay": 0.1}, "train_iters": {"TRAIN_STEPS": 143000},
              "lr_decay_iters": {"make_optimizer.decay_steps": 143000}, "checkpoint_factor": {"CHECKPOINT_EVERY": 1000},
              "extra_save_iters": {"train.save_steps": [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]},
              "eval_interval": {"EVAL_EVERY": 143000}, "eval_iters": {"EVAL_STEPS": 10},
              "log_interval": {"train.log_every": 10},
              "train_data_paths": {"DATA_PATH": "/home/mchorse/data/pile_deduped/pile_0.87_deduped_text_document"},
              "vocab_file": {"TOKENIZER": "/home/mchorse/data/tokenizers/20B_tokenizer.json"},
              "save": {"MODEL_DIR": "/home/mchorse/chk/"}, "load": {"RESTORE_FROM": None},
              "zero_optimization.cpu_offload": {"build_experiment.offload_optimizer_state": False}},
    defaults={"SEED": 1234, "train.keep_checkpoints": None, "DATA_SPLIT": "969,30,1", "GRAD_ACCUM_STEPS": 1},
    bindings=["--gin.MODEL_DIR='runs/pythia'", "--gin.TOKENIZER='home/mchorse/data/tokenizers/20B_tokenizer.json'"])

# NeoX's Llama configs (configs/llama*/) with its Llama train_config.yml: the llama family. The MLP widths are
# Llama's own (7B 11008, 70B 28672), which NeoX's ParallelMLP builds from these intermediate_size values.
NEOX_LLAMA_TRAINING = {
    "optimizer.type": {"OPTIMIZER": "adamw"}, "optimizer.params.lr": {"LEARNING_RATE": 0.0002},
    "optimizer.params.betas": {"make_optimizer.b1": 0.9, "make_optimizer.b2": 0.95},
    "optimizer.params.eps": {"make_optimizer.eps": 1e-8}, "min_lr": {"make_optimizer.min_learning_rate": 0.00002},
    "zero_optimization.stage": {"RULES": "zero1", "FSDP_PARALLEL": -1}, "train_micro_batch_size_per_gpu": {},
    "checkpoint_activations": {"model.remat_policy": "full"},
    "gradient_clipping": {"make_optimizer.clip_grad_norm": 1.0},
    "weight_decay": {"make_optimizer.weight_decay": 0.1}, "hidden_dropout": {"model.dropout_rate": 0.0},
    "attention_dropout": {"model.attention_dropout_rate": 0.0}, "fp16.fp16": {}, "fp16.enabled": {"DTYPE": "float16"},
    "fp16.loss_scale": {"LossScaleConfig.static_scale": 0.0},
    "fp16.loss_scale_window": {"LossScaleConfig.window": 1000},
    "fp16.hysteresis": {"LossScaleConfig.hysteresis": 2}, "fp16.min_loss_scale": {"LossScaleConfig.min_scale": 1.0},
    "train_iters": {"TRAIN_STEPS": 320000}, "lr_decay_iters": {"make_optimizer.decay_steps": 320000},
    "lr_decay_style": {"make_optimizer.decay": "cosine"}, "warmup": {"WARMUP_STEPS": 0.01},
    "checkpoint_factor": {"CHECKPOINT_EVERY": 10000}, "eval_interval": {"EVAL_EVERY": 1000},
    "eval_iters": {"EVAL_STEPS": 10}, "log_interval": {"train.log_every": 100}, "steps_per_print": {},
    "keep_last_n_checkpoints": {"train.keep_checkpoints": 4},
    "pipe_parallel_size": {"PIPELINE_PARALLEL": 1}, "model_parallel_size": {"TENSOR_PARALLEL": 1},
    "pos_emb": {"model.family": "llama"}, "norm": {"model.family": "llama"}, "activation": {"model.family": "llama"},
    "rotary_pct": {"model.family": "llama"}, "gpt_j_residual": {"model.family": "llama"},
    "no_weight_tying": {"model.tie_word_embeddings": False}, "use_bias_in_attn_linear": {"model.qkv_bias": False},
    "use_bias_in_norms": {}, "num_layers": {"model.num_layers": 32}, "hidden_size": {"model.embed_dim": 4096},
    "num_attention_heads": {"model.num_heads": 32}, "seq_length": {"SEQ_LEN": 2048},
    "max_position_embeddings": {"model.max_len": 2048}, "rms_norm_epsilon": {"model.layer_norm_eps": 1e-6},
}
NEOX_LLAMA_BINDINGS = ["--gin.MODEL_DIR='runs/llama'", "--gin.DATA_PATH='my-llama_text_document'"]
CASES["neox_llama_7b"] = dict(
    files=["neox/llama/7B.yml", "neox/llama/train_config.yml", "--num_gpus=8"],
    expected={**NEOX_LLAMA_TRAINING, "intermediate_size": {"model.mlp_dim": 11008}, "mlp_multiple_of": {},
              "use_bias_in_mlp": {}, "train_micro_batch_size_per_gpu": {"BATCH_SIZE": 4 * 8}},
    defaults={"model.num_key_value_heads": None, "model.rope_theta": 10000.0, "SEED": 1234},
    bindings=NEOX_LLAMA_BINDINGS)
CASES["neox_llama2_70b"] = dict(
    files=["neox/llama2/70B.yml", "neox/llama/train_config.yml", "--num_gpus=64"],
    expected={**NEOX_LLAMA_TRAINING, "intermediate_size": {"model.mlp_dim": 28672}, "mlp_multiple_of": {},
              "num_layers": {"model.num_layers": 80}, "hidden_size": {"model.embed_dim": 8192},
              "num_attention_heads": {"model.num_heads": 64}, "num_kv_heads": {"model.num_key_value_heads": 8},
              "rotary_emb_base": {"model.rope_theta": 1e6}, "seq_length": {"SEQ_LEN": 4096},
              "max_position_embeddings": {"model.max_len": 4096}, "rms_norm_epsilon": {"model.layer_norm_eps": 1e-5},
              "train_micro_batch_size_per_gpu": {"BATCH_SIZE": 4 * 64}},
    defaults={"SEED": 1234}, bindings=NEOX_LLAMA_BINDINGS)
CASES["neox_llama_7b_2023"] = dict(  # mlp_type: llama, activation: silu (LLaMAParallelMLP): 8/3 x 4096 up to 256
    files=["neox/llama-2023/7B.yml", "neox/llama/train_config.yml", "--num_gpus=8"],
    expected={**NEOX_LLAMA_TRAINING, "mlp_type": {"model.mlp_dim": 11008}, "activation": {"model.family": "llama"},
              "train_micro_batch_size_per_gpu": {"BATCH_SIZE": 4 * 8}},
    defaults={"model.num_key_value_heads": None, "SEED": 1234}, bindings=NEOX_LLAMA_BINDINGS)


def upstream_names(case: dict) -> set[str]:
    """Every setting the case's files write: a script's --flags, a YAML / JSON file's keys (sections dotted)."""
    names = set()
    for name in case["files"]:
        if name.startswith("--num_gpus"):
            continue
        path = UPSTREAM / name.split("=")[-1]
        text = path.read_text()
        if path.suffix == ".sh":
            names |= set(re.findall(r"(--[a-z][a-z0-9_-]*)", text)) - NOT_PASSED - case.get("not_passed", set())
        else:
            names |= flat_keys(yaml.safe_load(text))
    return names


def flat_keys(mapping: dict, prefix: str = "") -> set[str]:
    keys = set()
    for key, value in mapping.items():
        name = prefix + key.replace("-", "_")
        keys |= flat_keys(value, name + ".") if isinstance(value, dict) else {name}
    return keys


def tokenizer_stand_in(path: Path, kind: str) -> None:
    """What the gin file's TOKENIZER names, so --print_config can read its vocabulary: the real GPT-2 / NeoX-20B
    / T5 tokenizer files, or (CPM-Pretrain's vocab.json) a small Hugging Face tokenizer."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "wordlevel":
        from tokenizers import Tokenizer, models
        vocab = {f"w{i}": i for i in range(300)} | {"<unk>": 300, "<|endoftext|>": 301}
        Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(path))
        return
    source = shared_file(*{"gpt2": ("gpt2-bpe",), "neox": ("gpt-neox-20b-tokenizer", "20B_tokenizer.json"),
                           "spiece": ("t5-spiece", "spiece.model")}[kind])
    if kind == "gpt2":
        shutil.copy(source / "encoder.json", path)
        shutil.copy(source / "vocab.bpe", path.parent / "gpt2-merges.txt")
    elif kind == "spiece":
        path.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, path / "spiece.model")
    else:
        shutil.copy(source, path)


def not_migrated(gin_text: str) -> set[str]:
    section = gin_text.split("# ---- not migrated", 1)[-1] if "# ---- not migrated" in gin_text else ""
    names = {line[2:].split(" ")[0] for line in section.splitlines()[1:] if line.startswith("# ")}
    return {name if name.startswith("--") else name.replace("-", "_") for name in names}


@pytest.mark.parametrize("name", sorted(CASES))
def test_print_config_shows_every_upstream_value(name, tmp_path):
    case = CASES[name]
    home = tmp_path / "home"
    for path in case["files"]:
        if not path.startswith("--num_gpus"):
            source = UPSTREAM / path.split("=")[-1]
            shutil.copy(source, tmp_path / source.name)
    args = [a.split("=")[0] + "=" + Path(a.split("=")[1]).name if a.startswith("--deepspeed_config") else
            a if a.startswith("--") else Path(a).name for a in case["files"]]
    env = cpu_env(8, HOME=str(home))
    migrated = subprocess.run([sys.executable, "-m", "t5x_like.migrate", *args, "--output=run.gin"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    if "tokenizer" in case:  # NeoX's Llama configs name none: the preset's vocabulary
        tokenizer_stand_in(tmp_path / case["tokenizer"][0], case["tokenizer"][1])
    shown = subprocess.run([sys.executable, "-m", "t5x_like.train", "--gin_file=run.gin", "--print_config",
                            *case.get("bindings", [])], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    values = printed_config(shown.stdout)
    gin_text = (tmp_path / "run.gin").read_text()
    unchecked = upstream_names(case) - set(case["expected"]) - not_migrated(gin_text)
    assert not unchecked, f"upstream settings neither checked nor listed as not migrated: {sorted(unchecked)}"
    wanted = {key: value for checks in case["expected"].values() for key, value in checks.items()}
    wanted.update(case["defaults"])
    overridden = {b.split("=")[0][len("--gin."):] for b in case.get("bindings", [])}
    for key, value in wanted.items():
        expected = value.format(home=home) if isinstance(value, str) else value
        if key in overridden:  # a path this machine cannot have: the gin file holds upstream's
            assert f"{key} = {expected!r}" in gin_text or expected in ({}, None), key
            continue
        got = values.get(key, "(not shown)")
        matches = got == pytest.approx(expected) if isinstance(expected, float) else got == expected
        assert matches, f"{key}: --print_config shows {got!r}, upstream {expected!r}"


def test_neox_defaults_the_llama_family_does_not_build_are_listed(tmp_path):
    """What a NeoX Llama config leaves unsaid still differs here: NeoX's default scaled_normal output layers and
    its default MLP biases are listed as not migrated, naming NeoX's default."""
    shutil.copy(UPSTREAM / "neox" / "llama2" / "70B.yml", tmp_path)
    train = (UPSTREAM / "neox" / "llama" / "train_config.yml").read_text()
    (tmp_path / "train.yml").write_text("\n".join(line for line in train.splitlines() if "init_method" not in line))
    migrated = subprocess.run([sys.executable, "-m", "t5x_like.migrate", "70B.yml", "train.yml", "--num_gpus=64",
                               "--output=run.gin"], cwd=tmp_path, env=cpu_env(1), capture_output=True, text=True,
                              timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    section = (tmp_path / "run.gin").read_text().split("# ---- not migrated", 1)[1]
    assert "# output_layer_init_method not set: GPT-NeoX's default: the llama family initialises output layers" \
           in section
    assert "# use_bias_in_mlp not set: GPT-NeoX's default: the llama family's MLP has no biases" in section
