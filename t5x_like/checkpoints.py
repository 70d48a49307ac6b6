"""Orbax checkpoints: MODEL_DIR/checkpoints/<step>/{params, train_state, data, model}.

- params: the model parameters (all a params-only restore or a converted checkpoint holds)
- train_state: step, optimizer state, RNG, loss scale
- data: the data source's position (JSON)
- model: the model config (JSON), plus the tokenizer path, so later tools need only the path

Saves are asynchronous and atomic (orbax finalises a step directory only when complete);
restores reshard onto whatever mesh the target shardings describe.

Layout: canonical, stacked. A model's blocks are saved as one `blocks` entry per stack whose leaves
hold the layers on a leading axis (what model_config.scan_layers=True and a pipeline hold), in the
parameters and in every parameter-shaped part of the optimizer state alike; an unrolled run's
`block_0`, `block_1`, ... are stacked when saved and split again when restored (`stacked_layout`,
`as_target`). So scan_layers stays a run choice: any setting resumes or fine-tunes any checkpoint of
the same architecture, exactly. Stacked rather than unrolled because it is what TPU and pipelined
runs hold (they save without a copy) and because a deep model then has a few arrays to write and
index, not a few per layer. An unrolled run's save holds one stacked copy of its state on the device
until orbax has it in host memory. Checkpoints written unrolled by earlier versions still restore
(the stored layout is read from orbax's metadata).

Integrity: while a step is still orbax's temporary directory, process 0 writes `checksums.json`
(size and CRC-32 of every file) into it, so the manifest is committed with the step. Restoring a
step first checks every file against it, then checks the data position and the step agree and
that the parameters are finite; a step that fails names the file and the reason, and the trainer
falls back to the newest step that passes (`Checkpointer.restore_newest`).
"""
from __future__ import annotations

import concurrent.futures
import errno
import glob
import json
import os
import re
import zlib
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from absl import logging

from models.layers import STACKED, UNROLLED
from t5x_like import distributed, validate
from t5x_like.errors import UserError

CHECKPOINT_SUBDIR = validate.CHECKPOINT_SUBDIR
MANIFEST = "checksums.json"  # process 0's: the files it wrote and the shared ones (metadata, JSON items)
PROCESS_MANIFEST = "checksums.process_{}.json"  # process N > 0's: the files it wrote
# Files orbax writes at a step's top level after the manifest (they change when it finalises).
_UNCHECKED = ("_CHECKPOINT_METADATA", "commit_success.txt", MANIFEST)
_CHUNK = 64 << 20
ON_CORRUPT = ("fallback", "stop")


class CorruptCheckpointError(UserError):
    """A checkpoint step that cannot be trusted: names the step, the file and the reason."""

    def __init__(self, step_dir: str, file: str, reason: str):
        self.step_dir, self.file, self.reason = step_dir, file, reason
        super().__init__(f"checkpoint {step_dir} is damaged: {file}: {reason}")


def _manager(directory: str, *, keep: int | None = None, async_save: bool = True,
             on_finalise: Callable[[], None] | None = None) -> ocp.CheckpointManager:
    async_options = ocp.options.AsyncOptions(post_finalization_callback=on_finalise) if on_finalise else None
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True,
                                           async_options=async_options)
    return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                                 item_names=("params", "train_state", "data", "model"))


def file_crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def writer_of(relative: str) -> int:
    """The process that wrote a file of a step: orbax's per-process directories (`ocdbt.process_N/`,
    `array_metadatas/process_N`) name it; every other file is process 0's."""
    match = re.search(r"(?:^|/)(?:ocdbt\.)?process_(\d+)(?:/|$)", relative)
    return int(match[1]) if match else 0


def manifest_name(process: int) -> str:
    return MANIFEST if process == 0 else PROCESS_MANIFEST.format(process)


def _checked_files(step_dir: str, process: int | None = None) -> list[str]:
    """Paths relative to `step_dir` of every file a manifest covers (only `process`'s when given)."""
    found = []
    for root, _, files in os.walk(step_dir):
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), step_dir)
            unchecked = relative in _UNCHECKED or re.fullmatch(r"checksums\.process_\d+\.json(\.tmp)?", relative)
            if not unchecked and (process is None or writer_of(relative) == process):
                found.append(relative)
    return sorted(found)


def _digests(step_dir: str, files: list[str]) -> dict[str, dict]:
    """{file: {'size', 'crc32'}}, hashed in threads (zlib releases the GIL)."""
    def digest(name):
        path = os.path.join(step_dir, name)
        return name, {"size": os.path.getsize(path), "crc32": file_crc32(path)}
    with concurrent.futures.ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        return dict(pool.map(digest, files))


def _first_across_hosts(index: int) -> int:
    if jax.process_count() == 1:
        return index
    from jax.experimental import multihost_utils
    # a host value: a jax scalar would be a global array under the run's mesh, which allgather refuses
    return int(multihost_utils.process_allgather(np.int32(index)).min())


def write_manifest(step_dir: str, process: int | None = None) -> None:
    """Write the manifest of the files `process` wrote into the step (atomically); None: one manifest
    (checksums.json) covering every file. Each process hashes only its own files, so no host reads
    the whole checkpoint."""
    manifest = {"format": "t5x_like.checksums/1", "algorithm": "crc32",
                "files": _digests(step_dir, _checked_files(step_dir, process))}
    name = manifest_name(process or 0)
    tmp = os.path.join(step_dir, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=0)
    os.replace(tmp, os.path.join(step_dir, name))


def _read_manifests(step_dir: str) -> dict[str, dict]:
    """{file: {'size', 'crc32'}} from checksums.json and every process's checksums.process_N.json."""
    expected = {}
    for path in [os.path.join(step_dir, MANIFEST), *sorted(glob.glob(os.path.join(step_dir, "checksums.process_*.json")))]:
        try:
            with open(path) as f:
                expected.update(json.load(f)["files"])
        except (ValueError, KeyError, UnicodeDecodeError) as e:
            raise CorruptCheckpointError(step_dir, os.path.basename(path),
                                         f"unreadable ({type(e).__name__}: {e})") from None
    return expected


def verify_manifest(step_dir: str, *, sizes_only: bool = False) -> bool:
    """Check every file of the step against its manifest: False when the step has none (written by an
    older version, or a params-only converter); raises CorruptCheckpointError naming the first bad file.
    `sizes_only`: every file present at its recorded size (no checksums read: cheap, and no collective)."""
    if not os.path.exists(os.path.join(step_dir, MANIFEST)):
        return False
    expected = _read_manifests(step_dir)
    present = set(_checked_files(step_dir))
    missing = sorted(set(expected) - present)
    if missing:
        raise CorruptCheckpointError(step_dir, missing[0], "missing (deleted?)")
    unlisted = sorted({writer_of(name) for name in present - set(expected)})
    if unlisted:  # a process stopped between the commit and writing its manifest
        logging.warning("checkpoint %s: the files of process(es) %s have no checksums (%s missing); they are "
                        "read unverified", step_dir, unlisted, ", ".join(manifest_name(p) for p in unlisted))
    for name, want in expected.items():
        size = os.path.getsize(os.path.join(step_dir, name))
        if size != want["size"]:
            raise CorruptCheckpointError(step_dir, name, f"{size} bytes, {want['size']} when written (truncated?)")
    if sizes_only:
        return True
    names = sorted(expected)
    mine = names[jax.process_index()::jax.process_count()]  # each host hashes its share of the files
    bad = [name for name, got in _digests(step_dir, mine).items() if got["crc32"] != expected[name]["crc32"]]
    first_bad = _first_across_hosts(names.index(bad[0]) if bad else len(names))
    if first_bad < len(names):
        raise CorruptCheckpointError(step_dir, names[first_bad],
                                     "checksum mismatch (the bytes changed since it was written)")
    return True


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying the target shardings (what restore lays arrays out as)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


_UNROLLED_KEY = re.compile(UNROLLED.format(r"\d+"))


def _unrolled_count(node: Any) -> int:
    """How many unrolled blocks (`block_0` ...) `node` holds (0 unless it is a dict holding some)."""
    return sum(1 for key in node if _UNROLLED_KEY.fullmatch(str(key))) if isinstance(node, dict) else 0


def _is_stack(node: Any) -> bool:
    return isinstance(node, dict) and (STACKED in node or _unrolled_count(node) > 0)


def _layer_axis(sharding: Any, *, add: bool) -> Any:
    """A layer's sharding with the stack's leading 'layers' axis added (not split), or removed."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return sharding
    spec = (None, *sharding.spec) if add else tuple(sharding.spec)[1:]
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec),
                                      memory_kind=sharding.memory_kind)


def _stack_arrays(*layers: jax.Array) -> jax.Array:
    return jnp.stack(layers)


def _split_array(stack: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(stack)


def _stack(layers: list, sharding: Any = None) -> Any:
    """One leaf of every layer -> the stacked leaf (an array on the devices, laid out as `sharding`,
    by default the first layer's plus an unsplit layer axis; a ShapeDtypeStruct; a host array)."""
    first = layers[0]
    if isinstance(first, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(layers), *first.shape), first.dtype,
                                    sharding=sharding or _layer_axis(first.sharding, add=True))
    if isinstance(first, jax.Array):
        return jax.jit(_stack_arrays, out_shardings=sharding or _layer_axis(first.sharding, add=True))(*layers)
    return np.stack(layers)


def _split(stack: Any, shardings: list) -> list:
    """A stacked leaf -> its layers, laid out as `shardings` (one per layer)."""
    if isinstance(stack, jax.ShapeDtypeStruct):
        return [jax.ShapeDtypeStruct(stack.shape[1:], stack.dtype, sharding=s) for s in shardings]
    if isinstance(stack, jax.Array):
        return list(jax.jit(_split_array, out_shardings=tuple(shardings))(stack))
    return list(stack)


def _without_layers(node: dict) -> dict:
    return {k: v for k, v in node.items() if k != STACKED and not _UNROLLED_KEY.fullmatch(str(k))}


def stacked_layout(tree: Any) -> Any:
    """`tree` (parameters, or a train state holding parameter-shaped trees; arrays, ShapeDtypeStructs or
    host arrays) in the checkpoint layout: every dict's `block_0` ... `block_{n-1}` become one `blocks`
    entry whose leaves are the layers' stacked on a leading axis. A stacked tree is returned as is."""
    def convert(node):
        count = _unrolled_count(node)
        if not count:
            return node
        layers = [node[UNROLLED.format(i)] for i in range(count)]
        return {**_without_layers(node), STACKED: jax.tree.map(lambda *leaves: _stack(list(leaves)), *layers)}

    return jax.tree.map(convert, tree, is_leaf=lambda node: _unrolled_count(node) > 0)


def _unrolled_layout(abstract: Any) -> Any:
    """ShapeDtypeStructs in the unrolled layout (`blocks` split into `block_0` ...): the target for a
    checkpoint an earlier version wrote from an unrolled run."""
    def convert(node):
        if not (isinstance(node, dict) and STACKED in node):
            return node
        leaves, treedef = jax.tree.flatten(node[STACKED])
        count = leaves[0].shape[0]
        split = [_split(leaf, [_layer_axis(leaf.sharding, add=False)] * count) for leaf in leaves]
        return {**_without_layers(node),
                **{UNROLLED.format(i): treedef.unflatten([layers[i] for layers in split]) for i in range(count)}}

    return jax.tree.map(convert, abstract, is_leaf=lambda node: isinstance(node, dict) and STACKED in node)


def as_target(restored: Any, target: Any) -> Any:
    """`restored` (in the checkpoint's layout) in the layout of `target` (ShapeDtypeStructs with
    shardings): stacked leaves split into the target's `block_<i>`, or unrolled ones stacked into its
    `blocks`, each laid out as the target says (no target: as restored)."""
    if target is None:
        return restored

    def convert(want, got):
        if not _is_stack(want) or not isinstance(got, dict):
            return got
        count = _unrolled_count(want)
        if count and STACKED in got:
            leaves, treedef = jax.tree.flatten(got[STACKED])
            wants = [treedef.flatten_up_to(want[UNROLLED.format(i)]) for i in range(count)]
            split = [_split(leaf, [layer[j].sharding for layer in wants]) for j, leaf in enumerate(leaves)]
            return {**_without_layers(got),
                    **{UNROLLED.format(i): treedef.unflatten([layers[i] for layers in split]) for i in range(count)}}
        count = _unrolled_count(got)
        if STACKED in want and count:
            layers = [got[UNROLLED.format(i)] for i in range(count)]
            stacked = jax.tree.map(lambda w, *leaves: _stack(list(leaves), w.sharding), want[STACKED], *layers)
            return {**_without_layers(got), STACKED: stacked}
        return got

    return jax.tree.map(convert, target, restored, is_leaf=_is_stack)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _restore_target(step_dir: str, target: Any, *, parameters: bool = False) -> Any:
    """`target` in the layout the step's files hold (stacked; unrolled when an earlier version saved
    an unrolled run). For the parameters, a target of other names or shapes than the files' (another
    number of layers, another model) is refused in one line."""
    stored = _shapes(dict(ocp.StandardCheckpointHandler().metadata(epath.Path(step_dir) / "params")))
    disk = stacked_layout(target)
    if any(_UNROLLED_KEY.fullmatch(name) for path in stored for name in path.split("/")):
        disk = _unrolled_layout(disk)
    if parameters and target is not None and _shapes(disk) != stored:
        wanted = _shapes(disk)
        path = sorted(set(wanted) ^ set(stored) or {p for p in wanted if wanted[p] != stored[p]})[0]
        raise UserError(f"checkpoint {step_dir} holds another model than the one restoring it: parameter {path} is "
                        f"{stored.get(path, 'missing')} there, {wanted.get(path, 'missing')} here; restore it with "
                        "the model config it records (e.g. another num_layers is not converted).")
    return disk


class Checkpointer:
    """Saves steps asynchronously with a checksum manifest, keeps the last `keep`, and restores the
    newest step that verifies."""

    def __init__(self, model_dir: str, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.join(os.path.abspath(model_dir), CHECKPOINT_SUBDIR)  # orbax wants absolute paths
        self.keep = keep
        self._saving: int | None = None
        self._manager = _manager(self.directory, keep=keep, async_save=async_save,
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
        (tmp_dir,) = glob.glob(os.path.join(self.directory, f"{self._saving}.orbax-checkpoint-tmp*"))
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
                params=ocp.args.StandardRestore(_restore_target(step_dir, params, parameters=True)),
                train_state=ocp.args.StandardRestore(_restore_target(step_dir, train_state)),
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
        if steps and distributed.is_primary():
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
        """Delete all but the newest `keep` steps (orbax does it only when it saves)."""
        for step in sorted(self._manager.all_steps())[:-self.keep]:
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
        if self._saving is not None and not distributed.is_primary() and os.path.isdir(self.step_dir(self._saving)):
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


@jax.jit
def _all_finite(tree: Any) -> Any:
    """One program for the whole tree (not one dispatch per leaf): a bool per leaf."""
    return jax.tree.map(lambda x: jnp.isfinite(x).all(), tree)


def nonfinite_paths(tree: Any) -> list[str]:
    """'/'-joined paths of the leaves of `tree` holding a NaN or an infinity."""
    flags = _all_finite(tree)
    return [jax.tree_util.keystr(path, simple=True, separator="/")
            for path, finite in jax.tree_util.tree_leaves_with_path(jax.device_get(flags)) if not finite]


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
        target = _restore_target(step_dir, abstract_params, parameters=True)
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
    if distributed.is_primary():
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
