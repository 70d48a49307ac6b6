"""Issue 46: settings changed on resume. What the checkpoint cannot take (another optimizer, float16's loss scale
on a run saved without one) is one line naming the checkpoint, the first differing entry of the training state and
the fix, where it was an orbax traceback; the checkpoint stays as it was, and the run resumes with its own settings.
What it can take (BATCH_SIZE, SEQ_LEN: the data position is carried over, warned) resumes."""
import shutil
import subprocess
import sys

import pytest

from tests.support.environment import cpu_env

pytestmark = pytest.mark.system

RUN = ["--gin_file=quickstart.gin", "--gin.MODEL_DIR='run'", "--gin.BATCH_SIZE=2", "--gin.SEQ_LEN=16",
       "--gin.WARMUP_STEPS=1", "--gin.CHECKPOINT_EVERY=2", "--gin.EVAL_EVERY=0",
       "--gin.model_config.overrides={'num_layers': 1, 'embed_dim': 32, 'num_heads': 2, 'mlp_dim': 64}"]


def train(cwd, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "t5x_like.train", *RUN, *extra], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env={**cpu_env(1), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"})


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder holding run/, trained 2 steps with AdamW in float32 (a checkpoint at step 2)."""
    folder = tmp_path_factory.mktemp("saved")
    done = train(folder, "--gin.TRAIN_STEPS=2")
    assert done.returncode == 0, done.stderr[-3000:]
    return folder


@pytest.mark.parametrize("change, first_difference", [
    ("--gin.OPTIMIZER='adafactor'", "opt_state/1/0/mu/blocks/attn/key_bias is (1, 2, 16) there, missing here"),
    ("--gin.DTYPE='float16'", "loss_scale/good_steps is missing there, () here"),
])
def test_a_setting_the_checkpoint_cannot_take_is_one_line_and_the_run_resumes_without_it(
        saved, tmp_path, change, first_difference):
    shutil.copytree(saved / "run", tmp_path / "run")
    done = train(tmp_path, "--gin.TRAIN_STEPS=4", change)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = [line for line in done.stderr.splitlines() if line.strip()][-1]
    assert line.startswith(f"error: checkpoint {tmp_path}/run/checkpoints/2 holds the training state of other "
                           "settings than this run's: ") and first_difference in line, line
    assert "its config.gin records them" in line and "RESTORE_FROM" in line, line
    resumed = train(tmp_path, "--gin.TRAIN_STEPS=4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stderr and "done: step 4/4" in resumed.stderr, resumed.stderr[-3000:]
