"""What identifies a run's data, recorded with its position in every checkpoint: a resume on other data (a
corpus preprocessed again under the same prefix, another tokenizer, another split or blend) is refused in one
line naming what changed, instead of continuing at a position that now points into other rows.

A file is identified by its content, not its name (a corpus that moved with the run still matches): its size
and a CRC-32 of its first and last MiB (and of the index for token files), cheap for a corpus of any size.
"""
from __future__ import annotations

import os
import zlib
from collections.abc import Sequence

SAMPLE = 1 << 20  # bytes read from each end of a file


def file_fingerprint(path: str) -> dict:
    """Size and sampled CRC-32 of a token file (`path` its prefix: .bin and .idx) or of a plain file."""
    parts = [path + ".bin", path + ".idx"] if os.path.isfile(path + ".bin") else [path]
    return {"bytes": [os.path.getsize(p) for p in parts], "crc32": [_sampled_crc32(p) for p in parts]}


def _sampled_crc32(path: str) -> int:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        crc = zlib.crc32(f.read(SAMPLE))
        if size > SAMPLE:
            f.seek(max(SAMPLE, size - SAMPLE))
            crc = zlib.crc32(f.read(SAMPLE), crc)
    return crc


def data_fingerprint(paths: Sequence[str], tokenizer_sha256: str | None, **settings) -> dict:
    """The fingerprint of the data files `paths` (in order), their tokenizer and the settings that decide which
    rows they give (DATA_SPLIT, BLEND_WEIGHTS, ...)."""
    return {"files": [file_fingerprint(p) for p in paths], "tokenizer": tokenizer_sha256,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in settings.items()}}


def describe_change(saved: dict, now: dict, paths: Sequence[str]) -> str | None:
    """What differs between two fingerprints, in words (None: nothing)."""
    if len(saved.get("files", [])) != len(now["files"]):
        return f"the number of data files ({len(saved.get('files', []))} then, {len(now['files'])} now)"
    for index, (old, new) in enumerate(zip(saved["files"], now["files"])):
        if old != new:
            sizes = f"{', '.join(f'{b:,}' for b in old['bytes'])} bytes then, {', '.join(f'{b:,}' for b in new['bytes'])} now"
            return f"data file {index + 1} ({paths[index]}): {sizes}" if old["bytes"] != new["bytes"] else \
                f"data file {index + 1} ({paths[index]}): its contents (same size, other bytes)"
    if saved.get("tokenizer") != now["tokenizer"]:
        return (f"the tokenizer (sha256 {str(saved.get('tokenizer'))[:12]}… then, {str(now['tokenizer'])[:12]}… "
                "now)")
    for name in sorted((set(saved) | set(now)) - {"files", "tokenizer"}):
        if saved.get(name) != now.get(name):
            return f"{name} ({saved.get(name)!r} then, {now.get(name)!r} now)"
    return None
