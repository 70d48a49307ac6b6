"""What the pipeline-parallelism tests share (tests/partitioning/test_pipeline*.py)."""
import jax
import numpy as np

from t5x_like.checkpoint import store
from t5x_like.run import resume


def saved_and_restored(tmp_path, saved, target, shardings):
    """`saved` (a train state) written as a checkpoint and restored as `target` with `shardings`,
    checked equal to what was saved."""
    ckpt = store.Checkpointer(str(tmp_path), async_save=False)
    ckpt.save(0, params=saved.params, train_state=resume.train_state_item(saved), data_state={}, model={})
    restored, _ = resume.restore_newest(ckpt, target, shardings, on_corrupt="stop")
    ckpt.close()
    jax.tree.map(np.testing.assert_array_equal, restored.params, saved.params)
    jax.tree.map(np.testing.assert_array_equal, restored.opt_state, saved.opt_state)
    return restored
