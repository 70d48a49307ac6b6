"""What identifies a run's data, recorded with its position in every checkpoint: a resume on other data (a
corpus preprocessed again under the same prefix or edited in place, another tokenizer, another split or blend) is
refused in one line naming what changed, instead of continuing at a position that now points into other rows.

A file is identified by its content, not its name (a corpus that moved with the run still matches): its size and
the sha256 of all its bytes (for a token file, of its .bin and its .idx). A multi-GB corpus is not read at every
resume to know it:

- preprocess records the sha256 of the .bin and .idx it writes in the token file's P.json; a .bin or .idx
  modified after its P.json was written (edited in place) is not vouched for by it;
- a checkpoint records each file's modification time beside its sha256; at a resume, a file whose size and
  modification time are the checkpoint's has its sha256 (nothing read), one whose time differs (copied, touched
  or edited) and that no P.json vouches for is read once to compare; a file no P.json vouches for (Megatron's
  token files, JSONL pairs) is read once when the run's first checkpoint records it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path


def _parts(path: str) -> list[str]:
    """The files of a token file (`path` its prefix: .bin and .idx) or the plain file `path`."""
    return [path + ".bin", path + ".idx"] if os.path.isfile(path + ".bin") else [path]


def file_fingerprint(path: str) -> dict:
    """Sizes, modification times and (where P.json vouches for them) sha256 of the files of `path`; a sha256 not
    known yet is None (`completed` computes it)."""
    parts = _parts(path)
    stats = [os.stat(p) for p in parts]
    return {"bytes": [s.st_size for s in stats], "mtime_ns": [s.st_mtime_ns for s in stats],
            "sha256": _recorded_sha256(path, stats) if len(parts) == 2 else [None]}


def _recorded_sha256(prefix: str, stats: list[os.stat_result]) -> list[str | None]:
    """The .bin and .idx sha256 that preprocess recorded in P.json, when neither file is newer than P.json."""
    try:
        recorded = json.loads(Path(prefix + ".json").read_text(encoding="utf-8")).get("sha256") or {}
        written = os.stat(prefix + ".json").st_mtime_ns
    except (OSError, ValueError):
        return [None, None]
    return [recorded.get(kind) if stat.st_mtime_ns <= written else None for kind, stat in zip(("bin", "idx"), stats)]


def sha256_of(path: str) -> str:
    """The sha256 of the whole file (read once, a MiB at a time)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def data_fingerprint(paths: Sequence[str], tokenizer_sha256: str | None, **settings) -> dict:
    """The fingerprint of the data files `paths` (in order), their tokenizer and the settings that decide which
    rows they give (DATA_SPLIT, BLEND_WEIGHTS, ...)."""
    return {"files": [file_fingerprint(p) for p in paths], "tokenizer": tokenizer_sha256,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}}


def completed(fingerprint: dict, paths: Sequence[str]) -> dict:
    """`fingerprint` (of `paths`) with every file's sha256 known (computed now where it is not, once: the dict
    keeps it)."""
    for path, file in zip(paths, fingerprint["files"]):
        for k, part in enumerate(_parts(path)):
            if file["sha256"][k] is None:
                logging.info("data: reading %s (%s bytes) once for its sha256, which checkpoints record to "
                             "recognise the data on resume", part, f"{file['bytes'][k]:,}")
                file["sha256"][k] = sha256_of(part)
    return fingerprint


def describe_change(saved: dict, now: dict, paths: Sequence[str]) -> str | None:
    """What differs between a checkpoint's fingerprint and this run's (of `paths`), in words (None: nothing). A
    file whose content `now` does not know yet is compared by its modification time, else read (and `now` keeps
    its sha256). A checkpoint of an older version, which recorded no sha256, is compared by the files' sizes."""
    if len(saved.get("files", [])) != len(now["files"]):
        return f"the number of data files ({len(saved.get('files', []))} then, {len(now['files'])} now)"
    for index, (path, old, new) in enumerate(zip(paths, saved["files"], now["files"])):
        if old["bytes"] != new["bytes"]:
            return (f"data file {index + 1} ({path}): {', '.join(f'{b:,}' for b in old['bytes'])} bytes then, "
                    f"{', '.join(f'{b:,}' for b in new['bytes'])} now")
        if "sha256" in old and not _same_content(path, old, new):
            return f"data file {index + 1} ({path}): its contents (same size, other bytes)"
    if saved.get("tokenizer") != now["tokenizer"]:
        return (f"the tokenizer (sha256 {str(saved.get('tokenizer'))[:12]}… then, {str(now['tokenizer'])[:12]}… "
                "now)")
    for name in sorted((set(saved) | set(now)) - {"files", "tokenizer"}):
        if saved.get(name) != now.get(name):
            return f"{name} ({saved.get(name)!r} then, {now.get(name)!r} now)"
    return None


def _same_content(path: str, old: dict, new: dict) -> bool:
    for k, part in enumerate(_parts(path)):
        if new["sha256"][k] is None and new["mtime_ns"][k] == old["mtime_ns"][k]:
            new["sha256"][k] = old["sha256"][k]  # untouched since the checkpoint recorded it
        elif new["sha256"][k] is None:
            logging.info("data: %s was modified or copied since the checkpoint: reading it (%s bytes) to compare its "
                         "contents", part, f"{new['bytes'][k]:,}")
            new["sha256"][k] = sha256_of(part)
        if new["sha256"][k] != old["sha256"][k]:
            return False
    return True
