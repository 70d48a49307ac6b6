"""MODEL_DIR's own files around a run: opening it (one trainer at a time, storage faults in one line, the
checkpoints), the resolved config it records at each start, and no empty folders left after a failed start."""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Sequence

from t5x_like.checkpoint import storage, store
from t5x_like.cluster import peers, processes
from t5x_like.run import lock


def open_model_dir(run: contextlib.ExitStack, model_dir: str, keep: int | None,
                   save_steps: Sequence[int] = ()) -> store.Checkpointer:
    """MODEL_DIR opened for this run (released by `run`): storage errors as one line, the run lock and the
    clean-up of a failed start (process 0; also when another process's failure stops this one wherever its main
    thread waits), and its checkpoints, keeping the last `keep` (None: all) and those
    of `save_steps`."""
    run.enter_context(storage.one_line_errors(model_dir))  # a full disk: one line, not orbax's tracebacks
    if processes.is_primary():
        no_empty_folders = run.push(no_empty_folders_after_failure(model_dir))  # runs last, after the lock's release
        held = run.enter_context(lock.RunLock(model_dir))
        run.enter_context(peers.clean_up_on_stop(lambda: (held.release(), no_empty_folders(peers.PeerFailed))))
    ckpt = store.Checkpointer(model_dir, keep=keep, preserve=save_steps)
    run.callback(ckpt.close)
    return ckpt


def no_empty_folders_after_failure(model_dir: str) -> Callable[..., None]:
    """An ExitStack callback: a start that fails (a configuration error found once MODEL_DIR is locked and
    orbax has made checkpoints/) removes the folders it made and left empty: new ones in MODEL_DIR, then
    MODEL_DIR and the parents made for it."""
    made, path = [], os.path.abspath(model_dir)
    while not os.path.exists(path):
        made.append(path)  # innermost first
        path = os.path.dirname(path)
    existing = set() if made else set(os.listdir(model_dir))

    def on_exit(exc_type, *_) -> None:
        if exc_type is None or not os.path.isdir(model_dir):
            return
        for name in sorted(set(os.listdir(model_dir)) - existing):
            if os.path.isdir(os.path.join(model_dir, name)) and not os.path.islink(os.path.join(model_dir, name)):
                for folder, _, _ in os.walk(os.path.join(model_dir, name), topdown=False):
                    with contextlib.suppress(OSError):  # it holds files: kept
                        os.rmdir(folder)
        for folder in made:
            try:
                os.rmdir(folder)
            except OSError:  # not empty: kept, and so are its parents
                return

    return on_exit


def write_config(model_dir: str, step: int, config: str, operative: str) -> None:
    """MODEL_DIR/config.gin: the validated run's config (`config`; config.<step>.gin keeps each start's), and
    operative_config.gin: every setting, defaults included (`operative`); both empty for a run without a gin
    configuration (train() called from Python)."""
    texts = {"config.gin": config, f"config.{step}.gin": config, "operative_config.gin": operative}
    for name, text in texts.items():
        path = os.path.join(model_dir, name)
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
