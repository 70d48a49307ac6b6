"""Orbax checkpoints: MODEL_DIR/checkpoints/<step>/{params, train_state, data, model}.

- params: the model parameters (all a params-only restore or a converted checkpoint holds)
- train_state: step, optimizer state, RNG, loss scale
- data: the data source's position (JSON)
- model: the model config (JSON), plus the tokenizer path, so later tools need only the path

Saves are asynchronous and atomic (orbax finalises a step directory only when complete);
restores reshard onto whatever mesh the target shardings describe.

Layout (t5x_like/checkpoint/layout.py): canonical, stacked, whatever scan_layers, pipeline or mesh wrote it.
Integrity (t5x_like/checkpoint/integrity.py): a manifest of sizes and CRC-32s committed with every step, checked
by every reader; the trainer falls back to the newest step that passes (`Checkpointer.restore_newest`).
"""
from __future__ import annotations

import errno
import glob
import os
from typing import Any, Callable, Sequence

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath
from orbax.checkpoint._src.metadata import array_metadata_store  # the store orbax's own jax.Array handler keeps
from orbax.checkpoint._src.serialization import type_handler_registry

from t5x_like import checks
from t5x_like.checkpoint.integrity import (MANIFEST, CorruptCheckpointError, nonfinite_paths, verify_manifest,
                                           write_manifest)
from t5x_like.checkpoint.layout import as_target, restore_target, stacked_layout, with_shardings
from t5x_like.cluster import processes
from t5x_like.errors import UserError

__all__ = ["CHECKPOINT_SUBDIR", "CheckpointNotFoundError", "Checkpointer", "CorruptCheckpointError", "ON_CORRUPT",
           "locate", "nonfinite_paths", "read_model_info", "restore_params", "restore_pretrained", "save_params",
           "stored_param_shapes", "verify_manifest", "with_shardings"]
"""The checkpoints API (integrity and layout names included: readers and tests use them through this module)."""

CHECKPOINT_SUBDIR = checks.CHECKPOINT_SUBDIR
# Files orbax writes at a step's top level after the manifest (they change when it finalises).
ON_CORRUPT = ("fallback", "stop")
REPLICA_PARALLEL_MIN_BYTES = 1 << 20
"""orbax's replica-parallel saving splits a replicated shard among its replicas, each writing a slice it cuts on
device: one compiled program per array shape at a process's first save. Only slices of at least this many bytes
are cut; smaller arrays are written whole by one replica (a quickstart-sized model's first save compiled 80
slices, 3-6 s of a 2-step run, timed once by hand on a busy machine: docs/outputs.md)."""
# Registered on the registry itself: the public register_type_handler warns of the replaced handler before every
# command's output ("Type handler registry type ... overriding jax.Array"), and a one-line error read as two.
type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY.add(jax.Array, ocp.type_handlers.ArrayHandler(
    array_metadata_store=array_metadata_store.Store(), min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_BYTES),
    override=True, ignore_warnings=True)


def _manager(directory: str, *, keep: int | None = None, preserve: Sequence[int] = (), async_save: bool = True,
             on_finalise: Callable[[], None] | None = None) -> ocp.CheckpointManager:
    """orbax's manager keeping the newest `keep` steps (None: all) and every step of `preserve`."""
    async_options = ocp.options.AsyncOptions(post_finalization_callback=on_finalise) if on_finalise else None
    retention = {"max_to_keep": keep}
    if preserve and keep is not None:
        policies = ocp.checkpoint_managers
        retention = {"preservation_policy": policies.AnyPreservationPolicy(
            [policies.LatestN(keep), policies.CustomSteps(sorted(set(preserve)))])}
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=async_save, create=True,
                                           async_options=async_options, **retention)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                 item_names=("params", "train_state", "data", "model"))


class Checkpointer:
    """Saves steps asynchronously with a checksum manifest, keeps the last `keep` (None: every step) and the
    steps of `preserve` (train.save_steps), and restores the newest step that verifies."""

    def __init__(self, model_dir: str, *, keep: int | None = 3, preserve: Sequence[int] = (),
                 async_save: bool = True):
        self.directory = os.path.join(os.path.abspath(model_dir), CHECKPOINT_SUBDIR)  # orbax wants absolute paths
        self.keep, self.preserve = keep, set(preserve)
        self._saving: int | None = None
        self._manager = _manager(self.directory, keep=keep, preserve=preserve, async_save=async_save,
                                 on_finalise=self._on_finalise if async_save else None)
        self._folder = os.stat(self.directory).st_ino  # to tell a failed save from a folder removed under it

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def save(self, step: int, *, params: Any, train_state: dict, data_state: dict, model: dict) -> None:
        """Start an asynchronous save of `step` (it becomes visible only once complete, checksums included)."""
        logging.info("step %d: saving a checkpoint to %s", step, self.step_dir(step))
        self.wait()
        self._saving = step
        self._manager.save(step, force=True, args=ocp.args.Composite(
            params=ocp.args.StandardSave(stacked_layout(params)),
            train_state=ocp.args.StandardSave(stacked_layout(train_state)),
            data=ocp.args.JsonSave({"step": step, "position": data_state}),
            model=ocp.args.JsonSave(model),
        ))

    def _on_finalise(self) -> None:
        """orbax calls this on process 0 once every process has written its files, before the step
        directory is committed: process 0's manifest (its own files and the shared ones; with one
        process, every file) is committed with the step. Other processes hash their own files once
        the step is committed (`wait`)."""
        found = glob.glob(os.path.join(self.directory, f"{self._saving}.orbax-checkpoint-tmp*"))
        if not found:  # checkpoints/ was removed under the save: storage.py names it in one line
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                    os.path.join(self.directory, f"{self._saving}.orbax-checkpoint-tmp"))
        (tmp_dir,) = found
        write_manifest(tmp_dir, 0 if jax.process_count() > 1 else None)
        logging.info("checkpoint %d written (%s)", self._saving, _size_str(tmp_dir))

    def restore(self, step: int, *, params: Any, train_state: dict) -> tuple[Any, dict, dict]:
        """(params, train_state, data position) at `step`, laid out as the abstract targets say;
        CorruptCheckpointError when a file fails its checksum, the data position or the step
        disagree, or the parameters or optimizer state are not finite."""
        step_dir = self.step_dir(step)
        verified = verify_manifest(step_dir)
        if not verified:
            logging.warning("checkpoint %s has no %s (written by an older version?): restoring it unverified",
                            step_dir, MANIFEST)
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                params=ocp.args.StandardRestore(restore_target(step_dir, params, parameters=True)),
                train_state=ocp.args.StandardRestore(restore_target(step_dir, train_state)),
                data=ocp.args.JsonRestore(),
            ))
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - without checksums a damaged file shows up only here
            if verified:
                raise
            raise CorruptCheckpointError(step_dir, "(unverified)", f"{type(e).__name__}: {e}") from e
        data = restored.data
        position = data["position"] if set(data) == {"step", "position"} else data  # older: position only
        saved = (data.get("step", step), int(restored.train_state["step"]))
        if saved != (step, step):
            raise CorruptCheckpointError(step_dir, "data / train_state",
                                         f"saved at steps {saved} (data position, train state), not {step}")
        bad = nonfinite_paths({"params": restored.params, "opt_state": restored.train_state["opt_state"]})
        if bad:
            raise CorruptCheckpointError(step_dir, "params / train_state", f"non-finite values in {', '.join(bad[:5])}")
        return as_target(restored.params, params), as_target(restored.train_state, train_state), position

    def restore_newest(self, *, params: Any, train_state: dict, on_corrupt: str
                       ) -> tuple[int, Any, dict, dict] | None:
        """(step, params, train_state, data position) of the newest step that verifies, or None when
        there is no checkpoint. A damaged step is reported loudly and skipped ('fallback', then moved to
        `<step>.corrupt` so the run can save that step again) or stops the run ('stop')."""
        if on_corrupt not in ON_CORRUPT:
            raise UserError(f"train.on_corrupt_checkpoint={on_corrupt!r}: choose one of {ON_CORRUPT}.")
        steps = sorted(self._manager.all_steps(), reverse=True)
        damaged = []
        for i, step in enumerate(steps):
            try:
                restored = self.restore(step, params=params, train_state=train_state)
            except CorruptCheckpointError as e:
                older = steps[i + 1:]
                if on_corrupt == "stop" or not older:
                    raise CorruptCheckpointError(e.step_dir, e.file, e.reason + "; " + _corrupt_hint(
                        e.step_dir, older, on_corrupt)) from None
                logging.error("%s\n%s\nFALLING BACK to the previous checkpoint, step %d; this one is moved to "
                              "%s.corrupt\n%s", "!" * 100, e, older[0], e.step_dir, "!" * 100)
                damaged.append(step)
                continue
            self._set_aside(damaged)
            return (step, *restored)
        return None

    def set_aside_from(self, first: int, suffix: str) -> list[int]:
        """Move every step from `first` on to `<step><suffix>` (kept for inspection, never resumed from);
        returns those steps."""
        self.wait()
        steps = [step for step in sorted(self._manager.all_steps()) if step >= first]
        self._set_aside(steps, suffix)
        return steps

    def _set_aside(self, steps: list[int], suffix: str = ".corrupt") -> None:
        if steps and processes.is_primary():
            for step in steps:
                os.replace(self.step_dir(step), self.step_dir(step) + suffix)
        if steps:
            if jax.process_count() > 1:
                from jax.experimental import multihost_utils
                multihost_utils.sync_global_devices("t5x_like: damaged checkpoints set aside")
            self._manager.reload()

    def intact(self, step: int) -> bool:
        """Whether `step`'s files match its manifest (restore_newest says what is wrong otherwise)."""
        try:
            verify_manifest(self.step_dir(step))
        except CorruptCheckpointError:
            return False
        return True

    def model_info(self) -> dict | None:
        """The 'model' item of the newest step whose files verify (restore_newest reports the others)."""
        for step in sorted(self._manager.all_steps(), reverse=True):
            try:
                verify_manifest(self.step_dir(step))
                return self._manager.restore(step, args=ocp.args.Composite(model=ocp.args.JsonRestore())).model
            except (CorruptCheckpointError, ValueError, UnicodeDecodeError):
                continue
        return None

    def enforce_retention(self) -> None:
        """Delete all but the newest `keep` steps and the preserved ones (orbax does it only when it saves)."""
        if self.keep is None:
            return
        for step in sorted(self._manager.all_steps())[:-self.keep]:
            if step not in self.preserve:
                self._manager.delete(step)

    def wait(self) -> None:
        """Until the save in flight is committed; then a process other than 0 writes the manifest of the
        files it wrote into the step."""
        try:
            self._manager.wait_until_finished()
        except Exception as e:  # noqa: BLE001 - orbax fails in its own words when the files vanish
            if self._folder_removed():
                raise FileNotFoundError(errno.ENOENT, f"removed while step {self._saving} was being saved",
                                        self.directory) from e
            raise
        if self._saving is not None and not processes.is_primary() and os.path.isdir(self.step_dir(self._saving)):
            write_manifest(self.step_dir(self._saving), jax.process_index())
        self._saving = None

    def _folder_removed(self) -> bool:
        """Whether the checkpoints folder, or a step it held, was deleted (`rm -rf` racing a save can leave the
        folder itself, holding the files being written)."""
        try:
            replaced = os.stat(self.directory).st_ino != self._folder
        except FileNotFoundError:
            return True
        return replaced or any(not os.path.isdir(self.step_dir(step)) for step in self._manager.all_steps())

    def close(self) -> None:
        self.wait()
        self._manager.close()


def _corrupt_hint(step_dir: str, older: list[int], on_corrupt: str) -> str:
    if not older:
        return (f"there is no older checkpoint to fall back to: restore {step_dir} from a backup, or move it "
                "away to start the run over")
    return (f"the previous checkpoint is step {older[0]}: set train.on_corrupt_checkpoint='fallback' to resume "
            f"from it (or move {step_dir} away yourself)")


def _size_str(directory: str) -> str:
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(directory) for f in files)
    return f"{total / 2**20:,.1f} MiB"


class CheckpointNotFoundError(UserError, FileNotFoundError):
    """No checkpoint at a path the user gave (RESTORE_FROM, --checkpoint, a converter's SRC): a user
    mistake, so the CLIs print one line; still a FileNotFoundError for callers that probe."""


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
    raise CheckpointNotFoundError(
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
    """Only the parameters of the checkpoint at `path`, laid out as `abstract_params` says: what every
    reader (eval, generate, convert, RESTORE_FROM) loads. Verified as a resume is: the files against the
    step's checksums, then the parameters finite; CorruptCheckpointError names the step, the file and
    the older steps to use instead."""
    directory, step = locate(path)
    step_dir = os.path.join(directory, str(step))
    try:
        verified = verify_manifest(step_dir)
    except CorruptCheckpointError as e:
        raise _for_reader(e, directory, step) from None
    if not verified:
        logging.warning("checkpoint %s has no %s (written by an older version?): reading it unverified",
                        step_dir, MANIFEST)
    manager = _manager(directory, async_save=False)
    try:
        target = restore_target(step_dir, abstract_params, parameters=True)
        restored = manager.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(target))).params
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - without checksums a damaged file shows up only here
        if verified:
            raise
        raise _for_reader(CorruptCheckpointError(step_dir, "(unverified)", f"{type(e).__name__}: {e}"),
                          directory, step) from e
    finally:
        manager.close()
    params = as_target(restored, abstract_params)
    bad = nonfinite_paths(params)
    if bad:
        raise _for_reader(CorruptCheckpointError(step_dir, "params", f"non-finite values in {', '.join(bad[:5])}"
                                                 f"{', ...' if len(bad) > 5 else ''} (the run diverged)"),
                          directory, step)
    return params


def _for_reader(error: CorruptCheckpointError, directory: str, step: int) -> CorruptCheckpointError:
    """The error with what a reader can do: read an older step of the same run."""
    older = sorted((s for s in _step_numbers(directory) if s < step), reverse=True)
    hint = (f"read an older step instead: pass {os.path.join(directory, str(older[0]))} as the checkpoint "
            "(--checkpoint, convert's SRC, RESTORE_FROM)" if older else
            "there is no older step in this directory: restore it from a backup")
    return CorruptCheckpointError(error.step_dir, error.file, f"{error.reason}; {hint}")


def _step_numbers(directory: str) -> list[int]:
    return [int(name) for name in os.listdir(directory)
            if name.isdigit() and os.path.isdir(os.path.join(directory, name))]


def save_params(path: str, step: int, params: Any, model: dict) -> None:
    """Write a params-only checkpoint (what converters produce) at path/checkpoints/<step>, with its
    checksums (written once the step is complete, so readers verify it as they verify a trainer's)."""
    manager = _manager(os.path.join(path, CHECKPOINT_SUBDIR), async_save=False)
    try:
        manager.save(step, force=True, args=ocp.args.Composite(
            params=ocp.args.StandardSave(stacked_layout(params)), model=ocp.args.JsonSave(model)))
        manager.wait_until_finished()
    finally:
        manager.close()
    if processes.is_primary():
        write_manifest(os.path.join(path, CHECKPOINT_SUBDIR, str(step)))


def stored_param_shapes(path: str) -> dict:
    """The parameter tree of the checkpoint at `path` as ShapeDtypeStructs, from orbax's metadata
    (no array is read)."""
    directory, step = locate(path)
    metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(directory) / str(step) / "params")
    return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype), dict(metadata))


def restore_pretrained(path: str, abstract_params: dict, head_params: tuple[str, ...]) -> tuple[dict, list[str]]:
    """A new run's parameters from the checkpoint at `path` (RESTORE_FROM), laid out as
    `abstract_params` (ShapeDtypeStructs with shardings) says, and the names of the head collections
    (among `head_params`) that the checkpoint cannot supply: the run's own head when the checkpoint
    has none of that kind, or one of other shapes (another label count). Those are left out of the
    returned tree for the caller's fresh initialisation; a head only the checkpoint has is read and
    dropped. Everything else must match, as restore_params requires."""
    stored = stored_param_shapes(path)

    def shapes(tree):
        return jax.tree.structure(tree), [(a.shape, a.dtype) for a in jax.tree.leaves(tree)]

    fresh = [k for k in head_params if k in abstract_params
             and (k not in stored or shapes(stored[k]) != shapes(abstract_params[k]))]
    unused = [k for k in head_params if k in stored and (k not in abstract_params or k in fresh)]
    mesh = jax.tree.leaves(abstract_params)[0].sharding.mesh
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    target = {k: v for k, v in abstract_params.items() if k not in fresh}
    target.update({k: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), stored[k])
                   for k in unused})
    restored = restore_params(path, target)
    if unused:
        logging.info("RESTORE_FROM: the checkpoint's %s is not used by this run's model", ", ".join(unused))
    return {k: v for k, v in restored.items() if k not in unused}, fresh
