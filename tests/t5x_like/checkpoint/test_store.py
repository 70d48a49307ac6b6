"""t5x_like/checkpoint/store.py's saving options (its restore, integrity and layout are tested through the trainer in
run/test_faults_and_records.py, run/test_loop.py and test_golden.py)."""
import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from partitioning import make_mesh
from t5x_like.checkpoint import store


def saved_slices(tmp_path, monkeypatch, params) -> list[tuple[int, ...]]:
    """Save `params` replicated over 8 devices; the shapes orbax cut into per-replica slices on device (each
    distinct slice is a program compiled at a process's first save)."""
    cut = []
    slice_in_dim = jax.lax.slice_in_dim
    monkeypatch.setattr(jax.lax, "slice_in_dim", lambda x, *a, **k: cut.append(x.shape) or slice_in_dim(x, *a, **k))
    replicated = NamedSharding(make_mesh(data=8), PartitionSpec())
    params = {name: jax.device_put(value, replicated) for name, value in params.items()}
    ckpt = store.Checkpointer(str(tmp_path / "run"))
    try:
        ckpt.save(1, params=params, train_state={"step": np.int32(1), "opt_state": {}},
                  data_state={}, model={})
        ckpt.wait()
        restored, _, _ = ckpt.restore(1, params=None, train_state=None)
    finally:
        ckpt.close()
    for name, value in params.items():
        np.testing.assert_array_equal(restored[name], np.asarray(value), err_msg=name)
    return cut


def test_small_replicated_arrays_are_written_whole_and_large_ones_split_among_replicas(tmp_path, monkeypatch):
    """Below REPLICA_PARALLEL_MIN_BYTES a replica's share (a quickstart model's every array) is written whole by
    one replica: nothing is sliced, so nothing is compiled for saving; an array whose share reaches it still is."""
    rng = np.random.default_rng(0)
    small = {"kernel": rng.normal(size=(64, 96)).astype(np.float32), "bias": np.arange(96, dtype=np.float32)}
    assert saved_slices(tmp_path / "small", monkeypatch, small) == []
    rows = 8 * store.REPLICA_PARALLEL_MIN_BYTES // (4 * 1024)  # 8 replicas' shares of the minimum each
    large = {"embedding": rng.normal(size=(rows, 1024)).astype(np.float32)}
    assert saved_slices(tmp_path / "large", monkeypatch, large) == [(rows, 1024)] * 8
