"""train(): resume, restore onto another mesh, params-only restore, signals, bad configs, the CLI."""
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys

import gin
import jax
import numpy as np
import pytest

from models.neox import NeoXConfig
from partitioning import make_mesh
from t5x_like.checkpoint import store
from t5x_like.config import frontend
from t5x_like.errors import UserError
from tests.support.cli import REPO
from tests.support.environment import cpu_env
from tests.support.training import LOOP_MODEL, losses, params_at, run_train


@pytest.fixture(scope="module")
def straight_and_half(tmp_path_factory, synthetic_source):
    """A 20-step run, and a run stopped after 10 steps (its own directory)."""
    root = tmp_path_factory.mktemp("runs")
    run_train(root / "straight", synthetic_source, steps=20)
    run_train(root / "half", synthetic_source, steps=10)
    return root


@pytest.mark.integration
def test_resume_continues_exactly(straight_and_half, synthetic_source, tmp_path):
    resumed = tmp_path / "resumed"
    shutil.copytree(straight_and_half / "half", resumed)
    result = run_train(resumed, synthetic_source, steps=20)
    assert result.step == 20
    straight = losses(straight_and_half / "straight")
    assert losses(resumed) == straight  # bitwise: the same floats, dropout RNG and data position included
    _, want = params_at(straight_and_half / "straight")
    _, got = params_at(resumed)
    jax.tree.map(np.testing.assert_array_equal, got, want)



@pytest.mark.integration
def test_neox_resume_continues_exactly(synthetic_source, tmp_path):
    """GPT-NeoX (rotary, parallel residual, untied head): 6 steps straight equal 3, a restart, then 3."""
    neox = {"model": NeoXConfig(vocab_size=256, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                                dtype="float32")}
    run_train(tmp_path / "straight", synthetic_source, steps=6, checkpoint_every=3, settings=neox)
    run_train(tmp_path / "resumed", synthetic_source, steps=3, checkpoint_every=3, settings=neox)
    run_train(tmp_path / "resumed", synthetic_source, steps=6, checkpoint_every=3, settings=neox)
    assert losses(tmp_path / "resumed") == losses(tmp_path / "straight")
    jax.tree.map(np.testing.assert_array_equal, params_at(tmp_path / "resumed")[1],
                 params_at(tmp_path / "straight")[1])

@pytest.mark.integration
def test_resume_onto_another_mesh(straight_and_half, synthetic_source, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(straight_and_half / "half", moved)
    run_train(moved, synthetic_source, steps=20, mesh=make_mesh(data=2, fsdp=1, tensor=4))
    straight = losses(straight_and_half / "straight")
    got = losses(moved)
    np.testing.assert_allclose([got[s] for s in range(11, 21)], [straight[s] for s in range(11, 21)], rtol=1e-5)


@pytest.mark.integration
def test_resume_with_the_optimizer_state_offloaded_to_host(straight_and_half, synthetic_source, tmp_path):
    moved = tmp_path / "offloaded"
    shutil.copytree(straight_and_half / "half", moved)
    run_train(moved, synthetic_source, steps=20, settings={"offload_optimizer_state": True})
    straight, got = losses(straight_and_half / "straight"), losses(moved)
    np.testing.assert_allclose([got[s] for s in range(11, 21)], [straight[s] for s in range(11, 21)], rtol=1e-6)


def test_restore_from_takes_parameters_only(straight_and_half, synthetic_source, tmp_path):
    fresh = tmp_path / "finetune"
    result = run_train(fresh, synthetic_source, steps=0, restore_from=str(straight_and_half / "half"))
    assert result.step == 0
    step, got = params_at(fresh)
    assert step == 0
    _, want = params_at(straight_and_half / "half")
    jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.integration
def test_sigterm_saves_a_restorable_checkpoint(synthetic_source, tmp_path):
    class TerminatedAtFifthBatch(synthetic_source):
        def __next__(self):
            if self.index == 4 and self.split == "train":
                os.kill(os.getpid(), signal.SIGTERM)
            return super().__next__()

    one_device = make_mesh(data=1, devices=jax.devices()[:1])
    result = run_train(tmp_path, TerminatedAtFifthBatch, steps=20, mesh=one_device)
    assert result.stopped_by_signal == signal.SIGTERM and result.step == 5
    assert store.locate(str(tmp_path))[1] == 5
    assert run_train(tmp_path, synthetic_source, steps=8, mesh=one_device).step == 8  # resumes from it


@pytest.mark.parametrize("kwargs, match", [
    (dict(mesh_sizes=dict(data=8), batch_size=12), "does not divide over the 8 data-parallel shards"),
    (dict(mesh_sizes=dict(data=1, tensor=8), model=dataclasses.replace(LOOP_MODEL, num_heads=4)),
     r"\('heads', size 4\) does not divide over mesh axes tensor \(8 devices\)"),
    (dict(mesh_sizes=dict(data=8), grad_accum_steps=3), "not divisible by GRAD_ACCUM_STEPS=3"),
])
def test_bad_configs_fail_fast(synthetic_source, tmp_path, kwargs, match):
    sizes = kwargs.pop("mesh_sizes")
    with pytest.raises(ValueError, match=match):
        run_train(tmp_path, synthetic_source, steps=4, mesh=make_mesh(**sizes), settings=kwargs)


@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def test_missing_required_macro_names_the_flag(clean_gin):
    with pytest.raises(UserError, match=r"MODEL_DIR is required: pass --gin.MODEL_DIR="):
        frontend.parse_gin(["quickstart.gin"], [], [])


def test_bad_mesh_product_names_the_macros(clean_gin):
    settings = frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR = '/tmp/x'", "DATA_PARALLEL = 3"], [])
    with pytest.raises(ValueError, match="DATA_PARALLEL, PIPELINE_PARALLEL, FSDP_PARALLEL, EXPERT_PARALLEL and TENSOR_PARALLEL"):
        settings.experiment.mesh.build()


@pytest.mark.system
def test_cli_quickstart_writes_metrics_tensorboard_config_and_checkpoints(tmp_path):
    model_dir = tmp_path / "qs"
    cmd = [sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin", f"--gin.MODEL_DIR='{model_dir}'",
           "--gin.TRAIN_STEPS=4", "--gin.WARMUP_STEPS=1", "--gin.BATCH_SIZE=4", "--gin.SEQ_LEN=32", "--gin.EVAL_EVERY=2",
           "--gin.EVAL_STEPS=1", "--gin.CHECKPOINT_EVERY=2", "--gin.train.log_every=2"]
    env = cpu_env(2)
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in open(model_dir / "metrics.jsonl")]
    train_rows = [r for r in rows if "loss" in r]
    assert [r["step"] for r in train_rows] == [2, 4]
    for key in ("step", "loss", "learning_rate", "grad_norm", "tokens_per_sec", "step_time",
                "tflops_per_device", "mfu"):
        assert key in train_rows[0], key
    assert train_rows[0]["mfu"] is None  # CPU: no known peak
    assert [r["step"] for r in rows if "eval_ppl" in r] == [2, 4]
    assert "TRAIN_STEPS = 4" in (model_dir / "config.gin").read_text()
    assert "make_optimizer.weight_decay = 0.1" in (model_dir / "operative_config.gin").read_text()
    assert "model: gpt2: 4 layers, width 256, 4 heads x 64" in done.stderr
    assert os.listdir(model_dir / "tensorboard")
    assert sorted(os.listdir(model_dir / "checkpoints")) == ["2", "4"]
    info = store.read_model_info(str(model_dir))
    assert info["config"]["num_layers"] == 4 and info["tokenizer"]
    assert "step 4/4 (100.0%)" in done.stderr and "ETA" in done.stderr
