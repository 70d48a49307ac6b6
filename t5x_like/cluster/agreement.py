"""The processes of a job agree on the configuration before step 1: every process publishes its resolved settings
(every gin binding, the data files by size and digest, the checkpoint step it resumes from, the versions) over the
key-value store of jax's coordination service and compares them with process 0's; a difference stops every
process (t5x_like/cluster/peers.py), naming the setting, both values and the process."""
from __future__ import annotations

import hashlib
import json
import os
import platform
from typing import Any

from t5x_like.cluster import peers as job
from t5x_like.cluster.liveness import PREFIX
from t5x_like.errors import UserError

SETTINGS_DIR = PREFIX + "settings/"
AGREED_DIR = PREFIX + "agreed/"


def agree(facts: dict[str, str]) -> None:
    """Every process publishes `facts` (name -> value); each compares its own with process 0's and a
    difference stops every process, naming the setting, both values and the process. Returns once all
    processes agree. One process: nothing to do."""
    cluster = job.current()
    if cluster is None:
        return
    cluster.client.key_value_set(SETTINGS_DIR + str(cluster.me), json.dumps(facts))
    if cluster.me == 0:
        for process in range(1, cluster.count):
            cluster.wait_for(AGREED_DIR + str(process))
        cluster.client.key_value_set(AGREED_DIR + "all", "1")
        return
    reference = json.loads(cluster.wait_for(SETTINGS_DIR + "0"))
    differences = describe_differences(facts, reference, cluster.me)
    if differences:
        raise UserError(f"the processes were given different settings: {differences}. Start every process with "
                        "the same command line, gin files and data (process 0's are the reference).")
    cluster.client.key_value_set(AGREED_DIR + str(cluster.me), "1")
    cluster.wait_for(AGREED_DIR + "all")


def describe_differences(mine: dict[str, str], reference: dict[str, str], me: int, shown: int = 3) -> str:
    """'TRAIN_STEPS is 30 on process 1 but 20 on process 0; ...' for the first `shown` differences."""
    names = sorted(name for name in set(mine) | set(reference) if mine.get(name) != reference.get(name))
    parts = [f"{name} is {_short(mine.get(name))} on process {me} but {_short(reference.get(name))} on process 0"
             for name in names[:shown]]
    if len(names) > shown:
        parts.append(f"and {len(names) - shown} more ({', '.join(names[shown:shown + 5])}"
                     f"{', ...' if len(names) > shown + 5 else ''})")
    return "; ".join(parts)


def _short(value: str | None, limit: int = 80) -> str:
    if value is None:
        return "absent"
    return value if len(value) <= limit else value[:limit - 3] + "..."


def run_facts(resume_step: int | None, data_paths: Any, bindings: dict[str, str]) -> dict[str, str]:
    """What every process of a training job must share: every gin binding (`bindings`, the front-end's
    config.bindings.every_binding()), the files that `data_paths` (paths or token-file prefixes, in lists or dicts)
    name, each by size and a digest of its first and last MiB, the checkpoint step a run resumes from, and the
    Python / jax versions."""
    import jax
    import jaxlib

    facts = {"the checkpoint to resume": "none" if resume_step is None else f"step {resume_step}",
             "versions": f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}",
             **bindings}
    for path in sorted(_paths(data_paths)):
        for file in _files_of(path):
            facts[f"file {file}"] = _file_digest(file)
    return facts


def _paths(value: Any) -> set[str]:
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return set().union(*map(_paths, value)) if value else set()
    return set()


def _files_of(path: str) -> list[str]:
    """A file, or a token-file prefix's files (prefix.bin, prefix.idx, ...); directories are not read."""
    import glob

    if os.path.isfile(path):
        return [path]
    return sorted(f for f in glob.glob(glob.escape(path) + ".*") if os.path.isfile(f))


def _file_digest(path: str, chunk: int = 1 << 20) -> str:
    size = os.path.getsize(path)
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(chunk))
        if size > chunk:
            f.seek(max(chunk, size - chunk))
            digest.update(f.read(chunk))
    return f"{size:,} bytes, sha256 {digest.hexdigest()[:16]}"
