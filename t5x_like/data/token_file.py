"""Token files: `P.bin` (ids), `P.idx` (document index) and `P.json` (metadata).

`P.bin` + `P.idx` use the Megatron-LM / GPT-NeoX `MMIDIDX` indexed-dataset layout, so files written here
train in those stacks and theirs train here. `P.idx` is:

    magic b"MMIDIDX\\x00\\x00" | version <u8 = 1 | dtype code <u1 | n sequences <u8 | n+1 <u8 |
    sizes int32[n] | byte pointers int64[n] | document index int64[n+1]

Each sequence is one document (Megatron's GPT datasets read them the same way). `P.json` is ours: which
tokenizer produced the ids, the counts (checked when the file is opened) and the sha256 of `P.bin` and `P.idx`
(which identify the data in checkpoints: fingerprint.py). Megatron files have no `P.json`; they open without
metadata.
"""
from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import weakref
from pathlib import Path

import numpy as np

from t5x_like.cluster.host import pid_running
from t5x_like.data.fingerprint import sha256_of
from t5x_like.errors import UserError

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")
# Megatron-LM's dtype codes (megatron/core/datasets/indexed_dataset.py); float codes have no use here.
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
METADATA_FORMAT = "t5x_like.token_file/1"
_COPY_CHUNK = 1 << 22  # documents per chunk when writing the index


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else int32 (Megatron has no uint32 code; ids stay below 2**31)."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.int32)


class TokenFileError(UserError):
    """A token file that is missing, truncated or inconsistent; the message names the file and the fix."""


class MappedTokens:
    """The ids of `P.bin`. A range (`tokens[a:b]`, `tokens[i]`) is read with pread into a new array, so a file
    cut short while it is read (rewritten in place, truncated, even by another thread's reader racing the
    truncation) is a short read named by TokenFileError; a memory map read past the file's new end would kill the
    process with SIGBUS, naming nothing. Index arrays (`tokens[[i, j, ...]]`, used while a source is built) read
    through a memory map after the same size check."""

    def __init__(self, path: str, dtype: np.dtype, count: int):
        self.path, self.dtype, self.shape = path, np.dtype(dtype), (count,)
        self._bytes = count * self.dtype.itemsize
        self._open()

    def _open(self) -> None:
        self._fd = os.open(self.path, os.O_RDONLY)  # the inode read: a file replaced by rename stays readable
        weakref.finalize(self, os.close, self._fd)
        self._array = None

    def check(self) -> None:
        size = os.fstat(self._fd).st_size
        if size < self._bytes:
            raise TokenFileError(f"{self.path}: now {size} bytes, {self._bytes} when opened: the file was cut short "
                                 "while being read (rewritten in place or truncated); restore it, or write a new "
                                 "token file under another prefix, then resume from the last checkpoint")

    def _read_range(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(max(stop - start, 0), self.dtype)
        if out.nbytes and os.preadv(self._fd, [memoryview(out).cast("B")],
                                    start * self.dtype.itemsize) < out.nbytes:
            self.check()  # names the file cut short
            raise TokenFileError(f"{self.path}: a short read at id {start}: the file was cut short while being read")
        return out

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, slice) and key.step in (None, 1):
            return self._read_range(*key.indices(len(self))[:2])
        if isinstance(key, (int, np.integer)):
            index = int(key) + (len(self) if key < 0 else 0)
            if not 0 <= index < len(self):
                raise IndexError(f"{self.path}: id {key} of {len(self)}")
            return self._read_range(index, index + 1)[0]
        self.check()
        if self._array is None:
            self._array = np.memmap(self.path, self.dtype, mode="r", shape=self.shape) if self._bytes else \
                np.zeros(0, self.dtype)
        return np.array(self._array[key])

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self[:] if dtype is None else self[:].astype(dtype)

    def max(self, initial=None, chunk: int = 1 << 24):
        """The largest id (read a chunk at a time)."""
        best = initial
        for start in range(0, len(self), chunk):
            value = self[start:start + chunk].max()
            best = value if best is None else max(best, value)
        return best

    def __getstate__(self) -> dict:  # grain's worker processes: open the file again there
        return {"path": self.path, "dtype": self.dtype, "shape": self.shape, "_bytes": self._bytes}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open()
        self.check()


class TokenFile:
    """A token file: documents are `tokens[offsets[i]:offsets[i+1]]`."""

    def __init__(self, prefix: str, tokens: MappedTokens, offsets: np.ndarray, metadata: dict | None):
        self.prefix = prefix
        self.tokens = tokens
        self.offsets = offsets
        self.metadata = metadata

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.offsets[-1])

    def document(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.offsets[i]:self.offsets[i + 1]])


def open_token_file(prefix: str | os.PathLike) -> TokenFile:
    """Opens `prefix.bin` + `prefix.idx` (+ `prefix.json` when present) and validates them."""
    prefix = str(prefix)
    idx_path, bin_path, json_path = prefix + ".idx", prefix + ".bin", prefix + ".json"
    if os.path.isdir(prefix) or prefix.endswith(("/", os.sep)):
        found = sorted(p[:-len(".idx")] for p in glob.glob(os.path.join(glob.escape(prefix), "*.idx")))
        there = f"give one of its files' prefix, e.g. {found[0]!r}" if found else "there is no token file (.idx) in it"
        raise TokenFileError(f"{prefix}: names a folder, but a token file is named by its prefix (PREFIX for "
                             f"PREFIX.bin and PREFIX.idx); {there}")
    if prefix.endswith((".bin", ".idx")) and not os.path.exists(bin_path):
        raise TokenFileError(f"{prefix}: DATA_PATH takes the token file's prefix, without .bin / .idx: "
                             f"DATA_PATH='{prefix[:-4]}'")
    for path in (idx_path, bin_path):
        if not os.path.isfile(path):
            raise TokenFileError(f"{path}: missing; create the token file with "
                                 f"`python -m t5x_like.data.preprocess --output_prefix={prefix} ...`")
    dtype, sizes, pointers = _read_index(idx_path)
    offsets = _document_offsets(idx_path, sizes, pointers, dtype.itemsize)
    expected_bytes = int(offsets[-1]) * dtype.itemsize
    actual_bytes = os.path.getsize(bin_path)
    if actual_bytes != expected_bytes:
        raise TokenFileError(f"{bin_path}: {actual_bytes} bytes but {idx_path} describes {expected_bytes} "
                             f"({offsets[-1]} {dtype.name} tokens); the file is truncated or from another "
                             "run: re-run preprocess")
    metadata = _read_metadata(json_path, dtype, len(sizes), int(offsets[-1])) if os.path.exists(json_path) else None
    return TokenFile(prefix, MappedTokens(bin_path, dtype, int(offsets[-1])), offsets, metadata)


def _read_index(idx_path: str) -> tuple[np.dtype, np.ndarray, np.ndarray]:
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        header = f.read(HEADER.size)
    if len(header) < HEADER.size or header[:len(MAGIC)] != MAGIC:
        raise TokenFileError(f"{idx_path}: not an MMIDIDX index (magic {header[:len(MAGIC)]!r}, expected "
                             f"{MAGIC!r}); pass the prefix of a Megatron/NeoX or t5x_like token file")
    _, version, code, n, n_docs = HEADER.unpack(header)
    if version != VERSION:
        raise TokenFileError(f"{idx_path}: index version {version}, only {VERSION} is supported")
    if code not in DTYPE_CODES:
        raise TokenFileError(f"{idx_path}: token dtype code {code} is not an integer type "
                             f"(known: {sorted(DTYPE_CODES)})")
    expected = HEADER.size + 12 * n + 8 * n_docs
    if size != expected:
        raise TokenFileError(f"{idx_path}: {size} bytes but its header describes {expected} "
                             f"({n} sequences); the index is truncated: re-run preprocess")
    if n == 0:
        raise TokenFileError(f"{idx_path}: holds no documents; preprocess a non-empty corpus")
    sizes = np.memmap(idx_path, dtype=np.int32, mode="r", offset=HEADER.size, shape=(n,))
    pointers = np.memmap(idx_path, dtype=np.int64, mode="r", offset=HEADER.size + 4 * n, shape=(n,))
    return np.dtype(DTYPE_CODES[code]), sizes, pointers


def _document_offsets(idx_path: str, sizes: np.ndarray, pointers: np.ndarray, itemsize: int) -> np.ndarray:
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if not np.array_equal(pointers, offsets[:-1] * itemsize):
        raise TokenFileError(f"{idx_path}: documents are not stored back to back in the .bin "
                             "(pointers disagree with sizes); this reader needs a contiguous file")
    return offsets


def _read_metadata(json_path: str, dtype: np.dtype, num_documents: int, num_tokens: int) -> dict:
    try:
        with open(json_path) as f:
            metadata = json.load(f)
    except json.JSONDecodeError as e:
        raise TokenFileError(f"{json_path}:{e.lineno}: invalid JSON ({e.msg}); re-run preprocess") from e
    if metadata.get("format") != METADATA_FORMAT:
        raise TokenFileError(f"{json_path}: format {metadata.get('format')!r}, expected {METADATA_FORMAT!r}")
    found = (metadata.get("dtype"), metadata.get("num_documents"), metadata.get("num_tokens"))
    if found != (dtype.name, num_documents, num_tokens):
        raise TokenFileError(f"{json_path}: says dtype/documents/tokens = {found} but the .idx/.bin hold "
                             f"{(dtype.name, num_documents, num_tokens)}; the files come from different "
                             "runs: re-run preprocess")
    return metadata


SAMPLE_WINDOWS = 64
SAMPLE_WINDOW = 4096


def check_ids(file: TokenFile, vocab_size: int, tokenizer: str) -> None:
    """Raise when a sample of the ids (64 evenly spaced windows of 4096 tokens, ~1 MB read) holds one
    outside [0, vocab_size): the file was made with another tokenizer."""
    starts = np.unique(np.linspace(0, max(file.num_tokens - SAMPLE_WINDOW, 0), SAMPLE_WINDOWS).astype(np.int64))
    for start in starts:
        window = np.asarray(file.tokens[start:start + SAMPLE_WINDOW])
        bad = np.flatnonzero((window < 0) | (window >= vocab_size))
        if len(bad):
            raise TokenFileError(
                f"{file.prefix}.bin: token id {int(window[bad[0]])} at position {int(start + bad[0])} is outside "
                f"the vocabulary of {tokenizer} ({vocab_size} ids): the file was made with another tokenizer; "
                "set TOKENIZER to that one (or re-run preprocess with this one)")


def remove_stale_temporaries(prefix: str) -> list[str]:
    """Delete PREFIX.{bin,sizes,idx,json}.tmp<PID> left by writers that were killed (their pid no longer
    runs on this host); returns what was removed."""
    removed = []
    for path in glob.glob(glob.escape(prefix) + ".*.tmp*"):
        suffix = path[len(prefix):]
        match = re.fullmatch(r"\.(bin|sizes|idx|json)\.tmp(\d+)", suffix)
        if match and not pid_running(int(match[2])):
            os.unlink(path)
            removed.append(path)
    return removed


class TokenFileWriter:
    """Writes a token file atomically: everything goes to temporary files renamed into place on success,
    `P.json` last, so an interrupted run never leaves a file set that opens as complete.

        with TokenFileWriter(prefix, dtype, {"tokenizer": ...}) as writer:
            writer.write(ids, lengths)   # ids of several documents back to back, and their lengths
    """

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype, metadata: dict):
        self.prefix = str(prefix)
        self.dtype = np.dtype(dtype)
        self.metadata = metadata
        self.num_documents = 0
        self.num_tokens = 0
        self.max_id = -1
        self._tmp = f".tmp{os.getpid()}"
        self._bin_sha256 = hashlib.sha256()  # recorded in P.json: fingerprint.py identifies the data by it

    def __enter__(self) -> TokenFileWriter:
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        for path in remove_stale_temporaries(self.prefix):
            logging.info("removed %s, left by an interrupted run", path)
        self._bin = open(self.prefix + ".bin" + self._tmp, "wb")
        self._sizes = open(self.prefix + ".sizes" + self._tmp, "wb")
        return self

    def write(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        if len(ids):
            self.max_id = max(self.max_id, int(np.max(ids)))
        data = np.asarray(ids, self.dtype).tobytes()
        self._bin.write(data)
        self._bin_sha256.update(data)
        self._sizes.write(np.asarray(lengths, np.int32).tobytes())
        self.num_documents += len(lengths)
        self.num_tokens += int(np.sum(lengths, dtype=np.int64))

    def __exit__(self, exc_type, exc, tb) -> None:
        self._bin.close()
        self._sizes.close()
        try:
            if exc_type is None:
                self._finish()
        finally:
            for suffix in (".bin", ".sizes", ".idx", ".json"):
                Path(self.prefix + suffix + self._tmp).unlink(missing_ok=True)

    def _finish(self) -> None:
        if self.num_documents == 0:
            raise TokenFileError(f"{self.prefix}: no documents to write (all inputs were empty)")
        self._write_index(self.prefix + ".idx" + self._tmp)
        sha256 = {"bin": self._bin_sha256.hexdigest(), "idx": sha256_of(self.prefix + ".idx" + self._tmp)}
        metadata = {"format": METADATA_FORMAT, **self.metadata, "dtype": self.dtype.name,
                    "num_documents": self.num_documents, "num_tokens": self.num_tokens, "sha256": sha256}
        with open(self.prefix + ".json" + self._tmp, "w") as f:
            json.dump(metadata, f, indent=2)
        Path(self.prefix + ".json").unlink(missing_ok=True)
        for suffix in (".bin", ".idx", ".json"):
            os.replace(self.prefix + suffix + self._tmp, self.prefix + suffix)

    def _write_index(self, path: str) -> None:
        code = next(c for c, t in DTYPE_CODES.items() if np.dtype(t) == self.dtype)
        n = self.num_documents
        sizes_path = self.prefix + ".sizes" + self._tmp
        with open(path, "wb") as f:
            f.write(HEADER.pack(MAGIC, VERSION, code, n, n + 1))
            with open(sizes_path, "rb") as sizes:
                shutil.copyfileobj(sizes, f)
            start = 0
            for first in range(0, n, _COPY_CHUNK):
                sizes = np.fromfile(sizes_path, np.int32, count=_COPY_CHUNK, offset=4 * first)
                ends = start + np.cumsum(sizes, dtype=np.int64)
                f.write(((ends - sizes) * self.dtype.itemsize).tobytes())
                start = int(ends[-1])
            for first in range(0, n + 1, _COPY_CHUNK):
                f.write(np.arange(first, min(first + _COPY_CHUNK, n + 1), dtype=np.int64).tobytes())
