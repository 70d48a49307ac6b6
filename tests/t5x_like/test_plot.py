"""The plot command draws a real run's metrics.jsonl (several runs overlaid) into a PNG."""
import json

import gin
import numpy as np
import pytest

from t5x_like import plot  # noqa: F401 (run_config, training: gin's configurables)
from t5x_like.config import configurables, frontend  # noqa: F401 (run_config, training: gin's configurables)
from t5x_like.errors import UserError
from t5x_like.run import loop  # noqa: F401 (run_config, training: gin's configurables)

pytest.importorskip("matplotlib", reason="the plot command needs matplotlib (pip install -e .)")


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two real 6-step runs of the quickstart at tiny sizes on the builtin corpus (validation every 3 steps),
    differing in learning rate."""
    root = tmp_path_factory.mktemp("runs")
    for name, lr in (("lr2e-3", 2e-3), ("lr1e-2", 1e-2)):
        gin.clear_config()
        settings = frontend.parse_gin(["quickstart.gin"], [
            f"MODEL_DIR='{root / name}'", "TRAIN_STEPS=6", "WARMUP_STEPS=2", "BATCH_SIZE=8", "SEQ_LEN=16",
            f"LEARNING_RATE={lr}", "EVAL_EVERY=3", "EVAL_STEPS=1", "CHECKPOINT_EVERY=6", "train.log_every=1",
            "model_config.overrides={'num_layers': 1, 'embed_dim': 64, 'mlp_dim': 128}"], [])
        loop.train(settings)
    gin.clear_config()
    return root / "lr2e-3", root / "lr1e-2"


def test_plot_draws_every_curve_of_real_runs(two_runs, tmp_path):
    from PIL import Image

    output = tmp_path / "plot.png"
    plot.main([str(d) for d in two_runs] + [f"--output={output}"])
    rows = plot.read_metrics(str(two_runs[0]))
    assert [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in rows if "eval_loss" in r] == [3, 6]
    # 2 runs x (6 losses + 2 validation losses + 6 LRs + 6 grad norms + 6 throughputs)
    assert plot.plot([str(d) for d in two_runs], str(tmp_path / "again.png")) == 2 * 26
    image = np.asarray(Image.open(output).convert("RGB"))
    assert image.shape == (800, 1200, 3)
    blue, orange = np.array([31, 119, 180]), np.array([255, 127, 14])  # matplotlib's C0 and C1: one per run
    for colour in (blue, orange):
        assert (np.abs(image.astype(int) - colour).sum(-1) < 30).sum() > 500


def test_a_cut_short_last_line_and_a_resume_rewriting_steps(tmp_path):
    lines = [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 4.0}, {"step": 2, "eval_loss": 4.5},
             {"step": 2, "loss": 3.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"step": 3, "lo')
    rows = plot.read_metrics(str(tmp_path))
    assert rows == [{"step": 1, "loss": 5.0}, {"step": 2, "loss": 3.9}, {"step": 2, "eval_loss": 4.5}]


def test_a_directory_without_metrics_is_named(tmp_path):
    with pytest.raises(UserError, match="metrics.jsonl does not exist"):
        plot.main([str(tmp_path), f"--output={tmp_path / 'p.png'}"])
