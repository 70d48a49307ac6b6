"""Orbax checkpoints: MODEL_DIR/checkpoints/<step>/{params, train_state, data, model}.

- params: the model parameters (all a params-only restore or a converted checkpoint holds)
- train_state: step, optimizer state, RNG, loss scale
- data: the data source's position (JSON)
- model: the model config (JSON), plus the tokenizer path, so later tools need only the path

Saves are asynchronous and atomic (orbax finalises a step directory only when complete);
restores reshard onto whatever mesh the target shardings describe.
"""
from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

CHECKPOINT_SUBDIR = "checkpoints"


def _manager(directory: str, *, keep: int | None = None, async_save: bool = True) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                 item_names=("params", "train_state", "data", "model"))


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying the target shardings (what restore lays arrays out as)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


class Checkpointer:
    """Saves steps asynchronously, keeps the last `keep`, finds the latest to resume from."""

    def __init__(self, model_dir: str, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.join(model_dir, CHECKPOINT_SUBDIR)
        self._manager = _manager(self.directory, keep=keep, async_save=async_save)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, *, params: Any, train_state: dict, data_state: dict, model: dict) -> None:
        """Start an asynchronous save of `step` (it becomes visible only once complete)."""
        self._manager.save(step, force=True, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            train_state=ocp.args.StandardSave(train_state),
            data=ocp.args.JsonSave(data_state),
            model=ocp.args.JsonSave(model),
        ))

    def restore(self, step: int, *, params: Any, train_state: dict) -> tuple[Any, dict, dict]:
        """(params, train_state, data_state) at `step`, laid out as the abstract targets say."""
        restored = self._manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(params),
            train_state=ocp.args.StandardRestore(train_state),
            data=ocp.args.JsonRestore(),
        ))
        return restored.params, restored.train_state, restored.data

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()


def locate(path: str) -> tuple[str, int]:
    """(checkpoints directory, step) for a MODEL_DIR (latest step) or one step's directory."""
    path = os.path.abspath(path)
    candidates = [(os.path.join(path, CHECKPOINT_SUBDIR), None), (path, None)]
    base = os.path.basename(path.rstrip("/"))
    if base.isdigit():
        candidates.insert(0, (os.path.dirname(path), int(base)))
    for directory, step in candidates:
        if not os.path.isdir(directory):
            continue
        manager = _manager(directory, async_save=False)
        steps = manager.all_steps()
        manager.close()
        if step is None and steps:
            return directory, max(steps)
        if step is not None and step in steps:
            return directory, step
    raise FileNotFoundError(
        f"no checkpoint at {path}: expected a MODEL_DIR containing '{CHECKPOINT_SUBDIR}/<step>/' or a "
        "step directory such as MODEL_DIR/checkpoints/1000."
    )


def read_model_info(path: str) -> dict:
    """The 'model' item (model config + tokenizer) of the checkpoint at `path`."""
    directory, step = locate(path)
    if not os.path.isdir(os.path.join(directory, str(step), "model")):
        raise ValueError(
            f"checkpoint {directory}/{step} has no model config ('model' item); it was not written by "
            "t5x_like.train or t5x_like.convert. Re-save it with a current version."
        )
    manager = _manager(directory, async_save=False)
    try:
        return manager.restore(step, args=ocp.args.Composite(model=ocp.args.JsonRestore())).model
    finally:
        manager.close()


def restore_params(path: str, abstract_params: Any) -> Any:
    """Only the parameters of the checkpoint at `path`, laid out as `abstract_params` says."""
    directory, step = locate(path)
    manager = _manager(directory, async_save=False)
    try:
        return manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params))).params
    finally:
        manager.close()


def save_params(path: str, step: int, params: Any, model: dict) -> None:
    """Write a params-only checkpoint (what converters produce) at path/checkpoints/<step>."""
    manager = _manager(os.path.join(path, CHECKPOINT_SUBDIR), async_save=False)
    try:
        manager.save(step, force=True, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params), model=ocp.args.JsonSave(model)))
        manager.wait_until_finished()
    finally:
        manager.close()
