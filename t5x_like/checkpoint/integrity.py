"""Checkpoint integrity: while a step is still orbax's temporary directory, process 0 writes `checksums.json`
(size and CRC-32 of every file) into it, so the manifest is committed with the step. Restoring a
step first checks every file against it, then checks the data position and the step agree and
that the parameters are finite; a step that fails names the file and the reason, and the trainer
falls back to the newest step that passes (`Checkpointer.restore_newest`).

Each process hashes only the files it wrote (`checksums.process_N.json` beside process 0's), so no host reads the
whole checkpoint; a reader checks every manifest, and the parameters and optimizer state for NaN and infinity."""
from __future__ import annotations

import concurrent.futures
import glob
import json
import os
import re
import zlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from t5x_like.errors import UserError

MANIFEST = "checksums.json"  # process 0's: the files it wrote and the shared ones (metadata, JSON items)


PROCESS_MANIFEST = "checksums.process_{}.json"  # process N > 0's: the files it wrote


_UNCHECKED = ("_CHECKPOINT_METADATA", "commit_success.txt", MANIFEST)


_CHUNK = 64 << 20


class CorruptCheckpointError(UserError):
    """A checkpoint step that cannot be trusted: names the step, the file and the reason."""

    def __init__(self, step_dir: str, file: str, reason: str):
        self.step_dir, self.file, self.reason = step_dir, file, reason
        super().__init__(f"checkpoint {step_dir} is damaged: {file}: {reason}")


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


@jax.jit
def _all_finite(tree: Any) -> Any:
    """One program for the whole tree (not one dispatch per leaf): a bool per leaf."""
    return jax.tree.map(lambda x: jnp.isfinite(x).all(), tree)


def nonfinite_paths(tree: Any) -> list[str]:
    """'/'-joined paths of the leaves of `tree` holding a NaN or an infinity."""
    flags = _all_finite(tree)
    return [jax.tree_util.keystr(path, simple=True, separator="/")
            for path, finite in jax.tree_util.tree_leaves_with_path(jax.device_get(flags)) if not finite]
