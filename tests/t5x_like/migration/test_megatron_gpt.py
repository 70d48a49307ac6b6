"""Megatron-LM GPT scripts migrated as their users run them: one with `--fp16`, trained too (tests/data/megatron_gpt):
the dynamic loss scale starts at Megatron's 2**32, the first steps overflow as designed and are skipped while the
scale backs off, then the run trains to its last step with the loss falling; and Megatron-LM's GPT-3 175B example,
which takes its paths as the script's own arguments ($1 .. $5)."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.support.cli import run_cli
from tests.support.migration import megatron_token_file, page_script_migrated
from tests.support.shared_data import shared_file

SCRIPTS = Path(__file__).resolve().parents[2] / "data" / "megatron_gpt"
UPSTREAM = Path(__file__).resolve().parents[2] / "data" / "upstream" / "megatron"


def test_the_migration_page_shows_what_the_gpt2_tutorials_script_migrates_to(tmp_path):
    """docs/migrating.md's GPT-2 tutorial script: the shape is gpt2_medium's, so the file names that preset and
    overrides nothing; every line of the page's excerpt is one the migration writes."""
    _, excerpt, written = page_script_migrated("pretrain_gpt2.sh", tmp_path)
    assert "model_config.preset = 'gpt2_medium'  # the gpt2 family; upstream's shape is this preset's" in excerpt
    assert not any(line.startswith("model_config.overrides") for line in written)
    assert [line for line in excerpt if line not in written] == []


@pytest.mark.system
def test_a_megatron_fp16_script_trains_through_its_loss_scale_overflows(tmp_path):
    shutil.copy(SCRIPTS / "pretrain_gpt_tiny_fp16.sh", tmp_path)
    shutil.copy(shared_file("gpt2-bpe", "encoder.json"), tmp_path / "gpt2-vocab.json")
    shutil.copy(shared_file("gpt2-bpe", "vocab.bpe"), tmp_path / "gpt2-merges.txt")
    megatron_token_file(tmp_path / "data" / "tiny_text_document", tmp_path / "gpt2-vocab.json")
    run_cli("t5x_like.migrate", ["pretrain_gpt_tiny_fp16.sh", "--output=tiny.gin"], tmp_path)
    gin_text = (tmp_path / "tiny.gin").read_text()
    assert "DTYPE = 'float16'" in gin_text and "initial_scale_power = 32" in gin_text, gin_text
    # 40 float16 steps over GPT-2's 50257-id vocabulary cost more than compiling them: 58 -> 28 s of CPU optimised
    done = run_cli("t5x_like.train", ["--gin_file=tiny.gin"], tmp_path, devices=2, timeout=600, optimized=True)
    rows = [json.loads(line) for line in (tmp_path / "checkpoints" / "gpt_tiny_fp16" / "metrics.jsonl").read_text()
            .splitlines()]
    steps = [row for row in rows if "loss_scale" in row]
    assert [row["step"] for row in steps] == list(range(1, 41)), done.stderr[-2000:]
    skipped = [row["step"] for row in steps if row["skipped"]]
    scales = [row["loss_scale"] for row in steps]
    # Megatron's scaler: the first overflow uses up the hysteresis, every later one halves the scale
    assert scales[0] == 2.0 ** 32 and skipped == list(range(1, len(skipped) + 1)) and len(skipped) >= 3
    assert scales[:len(skipped) + 1] == [2.0 ** 32] * 2 + [2.0 ** (32 - i) for i in range(1, len(skipped))]
    trained = [row["loss"] for row in steps if not row["skipped"]]
    assert np.mean(trained[-5:]) < 0.8 * np.mean(trained[:5]), trained
    assert "Traceback" not in done.stderr and "error" not in done.stderr.lower(), done.stderr[-2000:]
    assert (tmp_path / "checkpoints" / "gpt_tiny_fp16" / "checkpoints" / "40").is_dir()


@pytest.mark.system
def test_a_script_taking_its_paths_as_arguments_is_given_them_after_a_double_dash(tmp_path):
    """The paths come out as given (relative ones stay relative, as the script's own paths do), and no argument
    the script reads is left noted as empty."""
    shutil.copy(UPSTREAM / "train_gpt3_175b_distributed.sh", tmp_path)
    run_cli("t5x_like.migrate", ["train_gpt3_175b_distributed.sh", "--num_gpus=1024", "--output=gpt3.gin", "--",
                                 "ckpts", "runs/tb", "vocab.json", "merges.txt", "my-corpus_text_document"], tmp_path)
    gin_text = (tmp_path / "gpt3.gin").read_text()
    for line in ("MODEL_DIR = 'ckpts'  # --save ckpts (train_gpt3_175b_distributed.sh:71)",
                 "train.tensorboard_dir = 'runs/tb'  # --tensorboard-dir runs/tb",
                 "TOKENIZER = 'vocab.json'  # --vocab-file vocab.json (train_gpt3_175b_distributed.sh:62); "
                 "--merge-file merges.txt (train_gpt3_175b_distributed.sh:63) beside it",
                 "DATA_PATH = 'my-corpus_text_document'  # --data-path my-corpus_text_document"):
        assert line in gin_text, gin_text
    assert "own arguments" not in gin_text and "RESTORE_FROM" not in gin_text, gin_text
