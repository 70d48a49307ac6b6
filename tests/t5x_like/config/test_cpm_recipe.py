"""CPM-1's preset and recipe (gin/cpm_1.gin): the published shape, CPM-Pretrain's settings, its mesh."""
import subprocess
import sys

import pytest

import configs
from tests.support.cli import REPO
from tests.support.environment import cpu_env



@pytest.mark.system
def test_cpm_1_print_config_shows_the_2_6b_model_and_cpm_pretrains_recipe(tmp_path):
    done = subprocess.run([sys.executable, "-m", "t5x_like.train", "--gin_file=cpm_1.gin",
                           f"--gin.MODEL_DIR='{tmp_path / 'run'}'", "--gin.DATA_PATH='data/zh_cpm'", "--print_config"],
                          cwd=REPO, env=cpu_env(8), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for line in ("# Model: gpt2: 32 layers, width 2560, 32 heads x 80, mlp 10240, vocab 30000",
                 "LEARNING_RATE = 0.00015", "WARMUP_STEPS = 3200", "TRAIN_STEPS = 320000", "DTYPE = 'float16'",
                 "make_optimizer.weight_decay = 0.01", "make_optimizer.clip_grad_norm = 1.0",
                 "make_optimizer.decay = 'cosine'", "LossScaleConfig.initial_scale_power = 16",
                 "LossScaleConfig.window = 1000", "LossScaleConfig.hysteresis = 2",
                 "TENSOR_PARALLEL = 2", "PIPELINE_PARALLEL = 2", "#     max_len = 1024"):
        assert line in out, line
    params = int(out.split("# Model: ")[1].splitlines()[1].split()[1].replace(",", ""))
    # 32 blocks of 12·2560² + 13·2560, 30000 (padded) + 1024 position rows of 2560, the final norm: ~2.6B
    assert abs(params - 2.6e9) < 0.05e9
    min_lr_ratio = float(out.split("make_optimizer.min_learning_rate_ratio = ")[1].split()[0])
    assert abs(1.5e-4 * min_lr_ratio - 1e-5) < 1e-10  # cosine to --min-lr 1e-5
    assert not (tmp_path / "run").exists()


def test_cpm_presets_are_gpt2_shapes():
    big, tiny = configs.get_model_config("cpm_1"), configs.get_model_config("cpm_1_tiny")
    assert (big.family, big.num_layers, big.embed_dim, big.num_heads, big.max_len, big.vocab_size) == \
        ("gpt2", 32, 2560, 32, 1024, 30000)
    assert tiny.family == "gpt2" and tiny.num_layers * tiny.embed_dim < 2048
