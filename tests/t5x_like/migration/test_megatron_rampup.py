"""Megatron-LM's --rampup-batch-size START INCREMENT SAMPLES migrates to BATCH_SIZE_RAMPUP, with --train-samples and
sample-counted schedule lengths counted through the ramp-up as Megatron counts them; a ramp-up Megatron refuses is
named in one line where the script writes it."""
from pathlib import Path

import pytest

from t5x_like.errors import UserError
from t5x_like.migration import translate, upstream
from tests.support.cli import run_cli
from tests.support.migration import printed_config

SCRIPT = """#!/bin/bash
GPT_ARGS="
    --num-layers 2 --hidden-size 64 --num-attention-heads 4
    --seq-length 32 --max-position-embeddings 32
    --micro-batch-size 4 --global-batch-size 16 {rampup}
    --lr 3e-3 --lr-decay-style cosine --lr-warmup-samples 100 --train-samples 1000
"
torchrun --nproc_per_node 2 pretrain_gpt.py $GPT_ARGS --save runs/ramp --data-path data/corpus
"""


def script(tmp_path: Path, rampup: str) -> Path:
    path = tmp_path / "ramp.sh"
    path.write_text(SCRIPT.format(rampup=rampup))
    return path


def test_a_megatron_script_ramping_its_batch_migrates_to_batch_size_rampup(tmp_path):
    out = translate.translate(upstream.read([str(script(tmp_path, "--rampup-batch-size 4 4 64"))]))
    assert out.value("BATCH_SIZE") == 16 and out.value("BATCH_SIZE_RAMPUP") == (4, 4, 64)
    # Megatron's batches while at most 64 samples are read: 4 x 6 steps (0 .. 20 read), 8 x 3 (24 .. 40), 12 x 2
    # (48, 60): 11 steps, 72 samples; then (1000 - 72) // 16 = 58 whole batches
    assert out.value("TRAIN_STEPS") == 11 + 58
    assert out.value("WARMUP_STEPS") == 13  # 72 samples after 11 steps, 88 after 12, 104 after 13
    assert any("learning-rate schedule advances by the samples" in note for note in out.notes)
    assert not out.skipped


def test_without_a_ramp_up_the_samples_divide_by_the_batch(tmp_path):
    out = translate.translate(upstream.read([str(script(tmp_path, ""))]))
    assert out.value("BATCH_SIZE_RAMPUP") is None
    assert (out.value("TRAIN_STEPS"), out.value("WARMUP_STEPS")) == (63, 7)  # ceil(1000 / 16), ceil(100 / 16)


@pytest.mark.parametrize("rampup, message", [
    ("--rampup-batch-size 4 4", r"ramp.sh:5: --rampup-batch-size 4 4 is not three whole numbers START INCREMENT "
                                r"SAMPLES"),
    ("--rampup-batch-size 4 5 64", r"ramp.sh:5: --rampup-batch-size 4 5 64: BATCH_SIZE_RAMPUP=\(4, 5, 64\): "
                                   r"BATCH_SIZE=16 - start 4 = 12 is not a multiple of the increment 5"),
    ("--rampup-batch-size 16 4 64", r"ramp.sh:5: --rampup-batch-size 16 4 64: .*Megatron-LM divides by zero"),
])
def test_a_ramp_up_megatron_refuses_is_named_where_the_script_writes_it(tmp_path, rampup, message):
    with pytest.raises(UserError, match=message) as refused:
        translate.translate(upstream.read([str(script(tmp_path, rampup))]))
    assert "\n" not in str(refused.value)


@pytest.mark.system
def test_the_migrated_ramp_up_is_what_training_reads(tmp_path):
    script(tmp_path, "--rampup-batch-size 4 4 64")
    run_cli("t5x_like.migrate", ["ramp.sh", "--output=ramp.gin"], tmp_path)
    shown = run_cli("t5x_like.train", ["--gin_file=ramp.gin", "--print_config"], tmp_path)
    values = printed_config(shown.stdout)
    assert values["BATCH_SIZE_RAMPUP"] == (4, 4, 64) and values["build_experiment.batch_size_rampup"] == (4, 4, 64)
    assert "batch size: 4 rows at first, 4 more every 21.3333 samples, 16 from step 12 on" in shown.stderr
