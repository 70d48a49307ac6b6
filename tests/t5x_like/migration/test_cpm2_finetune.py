"""`python -m t5x_like.migrate` on CPM-2-Finetune's full-model scripts as upstream wrote them
(tests/data/upstream/cpm2_finetune, SOURCE.md), then `train --print_config` on what it writes, as a user runs
them. The expected values are read off the upstream files by hand: finetune_cpm2.py writes --batch-size and
--gradient-accumulation-steps into its DeepSpeed config (so 32 x 4 data-parallel ways = 128 for LCQMC), and
--train-iters -1 means "count the steps from --epochs"."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cpm2 import write_lcsts
from tests.support.environment import cpu_env
from tests.support.migration import printed_config
from tests.support.shared_data import shared_file

pytestmark = pytest.mark.system

UPSTREAM = Path(__file__).resolve().parents[2] / "data" / "upstream" / "cpm2_finetune"


def migrate(cwd: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "t5x_like.migrate", *args], cwd=cwd, env=cpu_env(1),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def bindings(text: str) -> dict[str, str]:
    return {m[1]: m[2] for m in re.finditer(r"^([\w.]+) = (.*?)  # ", text, re.M)}


def test_the_lcqmc_script_as_written_migrates_to_the_cpm2_family(tmp_path):
    for name in ("finetune_cpm2_lcqmc.sh", "ds_full_model.json"):
        shutil.copy(UPSTREAM / name, tmp_path)
    migrate(tmp_path, "finetune_cpm2_lcqmc.sh", "--deepspeed_config=ds_full_model.json", "--output=lcqmc.gin")
    text = (tmp_path / "lcqmc.gin").read_text()
    values = bindings(text)
    assert "model_config.preset = 'cpm2'  # the cpm2 family; upstream's shape is this preset's" in text  # the 11B's
    assert {k: values[k] for k in ("OBJECTIVE", "TENSOR_PARALLEL", "BATCH_SIZE", "MICRO_BATCH_SIZE", "LEARNING_RATE",
                                   "EPOCHS", "RULES", "DTYPE", "WARMUP_STEPS", "optim.make_optimizer.decay",
                                   "optim.make_optimizer.weight_decay", "optim.make_optimizer.clip_grad_norm",
                                   "TOKENIZER", "RESTORE_FROM", "EVAL_EVERY", "EVAL_STEPS")} == {
        "OBJECTIVE": "'seq2seq'", "TENSOR_PARALLEL": "4", "BATCH_SIZE": "128", "MICRO_BATCH_SIZE": "32",
        "LEARNING_RATE": "2e-06", "EPOCHS": "10", "RULES": "'zero1_tensor'", "DTYPE": "'float16'",
        "WARMUP_STEPS": "0", "optim.make_optimizer.decay": "'constant'", "optim.make_optimizer.weight_decay": "0.01",
        "optim.make_optimizer.clip_grad_norm": "1.0", "TOKENIZER": "'/root/thu-plm/CPM-2-Finetune/bpe_cn'",
        "RESTORE_FROM": "'/root/thu-plm/checkpoints/cpm2'", "EVAL_EVERY": "100", "EVAL_STEPS": "10"}
    assert values["DATA_PATH"] == ("{'train': '/root/thu-plm/data/lcqmc/train.jsonl', "
                                   "'validation': '/root/thu-plm/data/lcqmc/dev.jsonl'}")
    listed = text[text.index("# ---- not migrated"):]
    assert "# --data-name lcqmc (finetune_cpm2_lcqmc.sh:42): CPM2Datasets.py builds lcqmc's inputs from a template" \
        in listed
    assert "OpenAI's tanh GELU" in listed and "train_micro_batch_size_per_gpu 8 (ds_full_model.json:2) is not used" \
        in text
    for flag in ("--no-load-optim", "--do-train", "--do-valid", "--log-file"):
        assert f"# {flag} " in listed
    assert "not recognised by this migration" not in listed


def test_the_lcsts_script_edited_as_its_readme_says_trains_on_its_task_files(tmp_path):
    """README: set WORKING_DIR, DATA_PATH and CKPT_PATH; then the migrated file passes --print_config (RESTORE_FROM
    unset: CPM-2-Finetune's checkpoints convert through ModelCenter's folder, docs/cpm.md)."""
    work = tmp_path / "CPM-2-Finetune"
    for folder, name in (("configs/model", "cpm2_config.json"), ("configs/deepspeed", "ds_full_model.json")):
        (work / folder).mkdir(parents=True)
        shutil.copy(UPSTREAM / name, work / folder / name)
    (work / "bpe_cn").mkdir()
    shutil.copy(shared_file("cpm2", "vocab.txt"), work / "bpe_cn" / "vocab.txt")
    data = write_lcsts(tmp_path / "lcsts")
    script = (UPSTREAM / "finetune_cpm2_lcsts.sh").read_text()
    for name, value in (("WORKING_DIR", work), ("DATA_PATH", f'"{data}"'), ("CKPT_PATH", f'"{tmp_path}/cpm2"')):
        script, count = re.subn(rf"^{name}=.*$", f"{name}={value}", script, flags=re.M)
        assert count == 1
    (tmp_path / "finetune_cpm2_lcsts.sh").write_text(script)
    migrate(tmp_path, "finetune_cpm2_lcsts.sh", "--output=lcsts.gin")
    text = (tmp_path / "lcsts.gin").read_text()
    assert "data.make_source.fields = ('text', 'summary')" in text and "model_config.preset = 'cpm2'  #" in text
    done = subprocess.run([sys.executable, "-m", "t5x_like.train", "--gin_file=lcsts.gin", "--gin.RESTORE_FROM=None",
                           "--print_config"], cwd=tmp_path, env=cpu_env(1), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = printed_config(done.stdout)
    assert {k: shown[k] for k in ("BATCH_SIZE", "MICRO_BATCH_SIZE", "TENSOR_PARALLEL", "EPOCHS", "TRAIN_STEPS",
                                  "LEARNING_RATE", "OBJECTIVE", "model.family", "model.embed_dim", "model.mlp_dim",
                                  "model.num_heads", "model.d_kv", "model.num_layers", "model.vocab_size")} == {
        "BATCH_SIZE": 128, "MICRO_BATCH_SIZE": 16, "TENSOR_PARALLEL": 4, "EPOCHS": 10,
        "TRAIN_STEPS": 10,  # 6 pairs: one step a pass
        "LEARNING_RATE": 3e-6, "OBJECTIVE": "seq2seq", "model.family": "cpm2", "model.embed_dim": 4096,
        "model.mlp_dim": 10240, "model.num_heads": 64, "model.d_kv": 64, "model.num_layers": 24,
        "model.vocab_size": 26240}
    assert shown["DATA_PATH"] == {"train": f"{data}/train.jsonl", "validation": f"{data}/dev.jsonl"}
