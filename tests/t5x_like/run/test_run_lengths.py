"""Runs in the units users bring (issue 31): extra save steps beside the newest checkpoints (Pythia's log-spaced
ones, step 0 the initial state), keep every checkpoint, a TensorBoard folder of their own (Megatron's
--tensorboard-dir), and EPOCHS (BMTrain's and GPT2-Chinese's fine-tuning: passes over the training split,
validation and a checkpoint after each)."""
import glob
import os

import gin
import jax
import numpy as np
import pytest

from t5x_like import metrics
from t5x_like.checkpoint import store
from t5x_like.config import frontend
from t5x_like.data import make_source
from t5x_like.errors import UserError
from tests.support.training import run_train


def saved_steps(model_dir) -> list[int]:
    folder = os.path.join(model_dir, store.CHECKPOINT_SUBDIR)
    return sorted(int(name) for name in os.listdir(folder) if name.isdigit())


def test_save_steps_are_kept_beside_the_newest_and_step_0_is_the_initial_state(synthetic_source, tmp_path):
    run_train(tmp_path / "run", synthetic_source, steps=6, checkpoint_every=2, keep_checkpoints=1, save_steps=[0, 1, 3])
    assert saved_steps(tmp_path / "run") == [0, 1, 3, 6]
    initial = store.restore_params(str(tmp_path / "run" / "checkpoints" / "0"), None)
    last = store.restore_params(str(tmp_path / "run"), None)
    assert not any(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(initial), jax.tree.leaves(last)))
    run_train(tmp_path / "run", synthetic_source, steps=10, checkpoint_every=2, keep_checkpoints=1, save_steps=[0, 1, 3])
    assert saved_steps(tmp_path / "run") == [0, 1, 3, 10]  # a resumed run keeps them too


def test_keep_checkpoints_none_keeps_every_one(synthetic_source, tmp_path):
    run_train(tmp_path / "run", synthetic_source, steps=8, checkpoint_every=2, keep_checkpoints=None)
    assert saved_steps(tmp_path / "run") == [2, 4, 6, 8]


def test_tensorboard_events_go_to_the_folder_given(synthetic_source, tmp_path):
    run_train(tmp_path / "run", synthetic_source, steps=2, tensorboard_dir=str(tmp_path / "tb"))
    assert glob.glob(str(tmp_path / "tb" / "events.out.tfevents.*"))
    assert not os.path.exists(tmp_path / "run" / "tensorboard")
    assert [row["step"] for row in metrics.read_rows(str(tmp_path / "run")) if "loss" in row] == [1, 2]


@pytest.mark.parametrize("kwargs, message", [
    ({"save_steps": 5}, "train.save_steps=5: expected a list of steps"),
    ({"save_steps": [2, -1]}, "train.save_steps=-1"),
    ({"keep_checkpoints": 0}, "train.keep_checkpoints=0"),
    ({"tensorboard_dir": ""}, "train.tensorboard_dir=''"),
])
def test_bad_retention_settings_are_refused(synthetic_source, tmp_path, kwargs, message):
    with pytest.raises(UserError, match=message.replace("[", r"\[")):
        run_train(tmp_path / "run", synthetic_source, steps=2, **kwargs)


QUICKSTART = ["quickstart.gin"]


def parsed(*bindings: str) -> dict:
    """The run's lengths after the gin front-end parses quickstart.gin with `bindings`, as train and --print_config
    do: the macros train() is called with, which the settings the front-end hands down repeat."""
    gin.clear_config()
    settings = frontend.parse_gin(QUICKSTART, ["MODEL_DIR='unused'", *bindings], [])
    lengths = {name: gin.query_parameter(f"%{name}") for name in ("TRAIN_STEPS", "EVAL_EVERY", "CHECKPOINT_EVERY")}
    assert lengths == {"TRAIN_STEPS": settings.loop.train_steps, "EVAL_EVERY": settings.loop.eval_every,
                       "CHECKPOINT_EVERY": settings.loop.checkpoint_every}
    return lengths


def one_pass(batch_size: int) -> int:
    """Batches of one pass over the quickstart's training split, counted by reading it: every row comes once in a
    pass (shuffled), so the first row read again starts the next pass."""
    source = make_source("train", batch_size=batch_size, feature_lengths={"targets": 64}, seed=0, shard_index=0,
                         shard_count=1)
    seen = set()
    while True:
        for row in next(source)["decoder_target_tokens"]:
            if row.tobytes() in seen:
                source.close()
                return -(-len(seen) // batch_size)
            seen.add(row.tobytes())


def test_epochs_set_the_run_length_and_one_validation_and_checkpoint_per_pass():
    got = parsed("BATCH_SIZE=512", "SEQ_LEN=64", "EPOCHS=3", "EVAL_EVERY=100")
    steps = one_pass(512)
    assert got == {"TRAIN_STEPS": 3 * steps, "EVAL_EVERY": steps, "CHECKPOINT_EVERY": steps}
    assert parsed("BATCH_SIZE=512", "SEQ_LEN=64", "EPOCHS=3", "EVAL_EVERY=0")["EVAL_EVERY"] == 0
    with pytest.raises(UserError, match="EPOCHS=0"):
        parsed("BATCH_SIZE=512", "SEQ_LEN=64", "EPOCHS=0")
