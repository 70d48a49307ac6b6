"""Checkpoints written by earlier code keep their meaning (issue 30): tests/data/golden holds small checkpoints
of every family, trained 2 steps by the code before the layer-library and objectives redesign, with what that
code computed from them (tests/data/golden/make_golden.py). Today's code must restore each one and compute the
same per-token scores, write the same Hugging Face tensors, and continue training (parameters, optimizer state
and data position restored) to the same loss and gradient norm."""
import functools
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

import models
from partitioning import make_mesh
from t5x_like import metrics, optim
from t5x_like.convert import hf
from t5x_like.data import SourceSettings, make_source
from t5x_like.experiment import ExperimentSettings
from t5x_like.inference import loading
from t5x_like.lm import make_lm
from t5x_like.run import loop
from t5x_like.run.settings import LoopSettings, RunSettings
from tests.support import families

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[2] / "data" / "golden"
CHECKPOINTS = sorted(path.name for path in GOLDEN.iterdir() if (path / "checkpoints").is_dir())
"""The golden checkpoints, a folder each, named after the family whose model it holds."""
OBJECTIVES = {"decoder_only": "causal_lm", "encoder_decoder": "span_corruption", "encoder_only": "mlm"}
"""kind -> the objective its golden runs trained (on tests/support/families.py's LENGTHS of the kind)."""


def golden_run(name: str):
    """(model config, objective, feature lengths) of the golden checkpoint `name`, as its own records say."""
    config, _ = loading.read_config(str(GOLDEN / name))
    kind = models.family_of(config).kind
    return config, OBJECTIVES[kind], dict(families.LENGTHS[kind])


def expected(name: str, prefix: str) -> dict[str, np.ndarray]:
    with np.load(GOLDEN / name / "expected.npz") as stored:
        return {k[len(prefix):]: stored[k] for k in stored.files if k.startswith(prefix)}


def test_the_golden_checkpoints_are_named_after_their_families():
    assert CHECKPOINTS and all(golden_run(name)[0].family == name for name in CHECKPOINTS)


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_scores_and_hugging_face_tensors_are_those_of_the_code_that_wrote_them(name):
    checkpoint = str(GOLDEN / name)
    config, _ = loading.read_config(checkpoint)
    params = hf.restore_on_host(checkpoint, config)
    scores = jax.jit(make_lm(config).score)(params, expected(name, "input/"))
    for key, want in expected(name, "score/").items():
        np.testing.assert_allclose(np.asarray(scores[key]), want, rtol=1e-5, atol=1e-5, err_msg=f"{name}: {key}")
    tensors = dict(hf.hf_tensors(checkpoint))
    want = expected(name, "hf/")
    assert sorted(tensors) == sorted(want)
    for key in want:
        np.testing.assert_array_equal(tensors[key], want[key], err_msg=f"{name}: {key}")


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_training_resumes_to_the_same_loss(name, tmp_path, monkeypatch):
    config, objective, lengths = golden_run(name)
    shutil.copytree(GOLDEN / name / "checkpoints", tmp_path / "run" / "checkpoints")
    monkeypatch.chdir(GOLDEN)  # the corpus is named as the run named it
    experiment = ExperimentSettings(model=config, mesh=make_mesh(data=1, devices=jax.devices()[:1]), batch_size=4,
                                    optimizer=optim.OptimizerSettings(learning_rate=1e-2, warmup_steps=1),
                                    feature_lengths=lengths)
    loop.train(RunSettings(loop=LoopSettings(model_dir=str(tmp_path / "run"), train_steps=3, checkpoint_every=2,
                                             log_every=1, eval_every=0), experiment=experiment),
               data_source=functools.partial(make_source, settings=SourceSettings(objective=objective,
                                                                                  data_path="data/corpus")))
    row = [r for r in metrics.read_rows(str(tmp_path / "run")) if r.get("step") == 3][0]
    want = expected(name, "resumed/")
    assert (row["loss"], row["grad_norm"]) == pytest.approx((float(want["loss"]), float(want["grad_norm"])),
                                                            rel=1e-5)
