"""`python -m t5x_like.train` that fails to start (a configuration error found after MODEL_DIR is locked and
orbax has opened MODEL_DIR/checkpoints) exits with the one-line error and leaves no new empty folders:
a new MODEL_DIR (and the parents made for it) is gone, an existing one holds what it held before. The same
when another process's failure stops process 0 of a job wherever its main thread waits."""
import contextlib
import os
import subprocess
import sys

import pytest

from t5x_like.cluster import peers
from t5x_like.run import directory
from tests.support.cli import REPO
from tests.support.environment import cpu_env

pytestmark = pytest.mark.system

ERRORS = {"mesh": ("--gin.DATA_PARALLEL=16", "the mesh needs 16 devices, but only 2 are present"),
          "data": ("--gin.DATA_PATH='/nonexistent/corpus'", "/nonexistent/corpus.idx: missing")}


def failed_start(model_dir, error: str) -> None:
    binding, message = ERRORS[error]
    done = subprocess.run([sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin",
                           f"--gin.MODEL_DIR='{model_dir}'", binding], cwd=REPO, env=cpu_env(2),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-3000:]


def tree(path) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), path)
                  for root, dirs, files in os.walk(path) for name in dirs + files)


@pytest.mark.parametrize("error", sorted(ERRORS))
def test_a_new_model_dir_is_not_left_behind(tmp_path, error):
    failed_start(tmp_path / "new" / "run", error)
    assert os.listdir(tmp_path) == []


def test_an_existing_model_dir_keeps_only_what_it_held(tmp_path):
    model_dir = tmp_path / "run"
    (model_dir / "kept_empty").mkdir(parents=True)
    (model_dir / "notes.txt").write_text("mine")
    before = tree(model_dir)
    failed_start(model_dir, "mesh")
    assert tree(model_dir) == before


def test_a_stop_by_a_watching_thread_releases_the_lock_and_leaves_no_empty_folders(tmp_path, monkeypatch, capfd):
    """Process 0 of a job, stopped by process 1's failure while its main thread waits in native code (a
    compilation): no exception can reach the main thread's clean-up, so the thread that watches the others
    exits the process itself (t5x_like/cluster/peers.py). The run lock and the new empty folders go first, as
    after any failed start (CI met a run.lock left behind this way)."""
    watching = peers.Cluster(None, process_id=0, num_processes=2, heartbeat_timeout=10, coordinator="x:1")
    watching.store_lost = True  # no coordination service to tell
    monkeypatch.setattr(peers, "_cluster", watching)
    monkeypatch.setattr(os, "dup2", lambda *_: None)  # keeps pytest's stderr
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    model_dir = tmp_path / "new" / "run"
    with contextlib.ExitStack() as run:
        directory.open_model_dir(run, str(model_dir), keep=None)
        assert (model_dir / "run.lock").exists()
        watching._exit("process 1 failed: missing/corpus.idx: missing")  # what the watching thread calls
        assert exits == [1] and os.listdir(tmp_path) == [], os.listdir(tmp_path)
    assert capfd.readouterr().err.endswith("error: process 1 failed: missing/corpus.idx: missing\n")
