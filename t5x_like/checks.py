"""Checks of user-given values, one helper per kind, each raising a one-line UserError that names the
value and the fix. CLIs and gin configurables call them where the value enters, before any work.

    positive_int('--batch_size', args.batch_size)
    finite_float('LEARNING_RATE', learning_rate, minimum=0.0)
    writable_file('--output', args.output)      # before the work, not after it
    output_file('--output', args.output)        # the same, outside any run's checkpoints, its folder made
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Any

import numpy as np

from t5x_like.errors import UserError

CHECKPOINT_SUBDIR = "checkpoints"
"""MODEL_DIR/checkpoints/<step>/ (named here so that checking an output path imports no checkpoint library)."""
STEP_MARKER = "_CHECKPOINT_METADATA"  # orbax writes it into every step directory
RUN_MARKERS = ("metrics.jsonl", "run.lock", "config.gin")


def integer(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
            fix: str = "") -> int:
    """`value` as an int within [minimum, maximum]; bools and strings ('8', 'abc') are refused."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"{name}={value!r}: expected an integer{_range(minimum, maximum)} (no quotes), "
                        f"e.g. {name}={max(minimum or 0, 1) if maximum is None else maximum}{_fix(fix)}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise UserError(f"{name}={value}: must be{_range(minimum, maximum)}{_fix(fix)}")
    return value


def positive_int(name: str, value: Any, *, maximum: int | None = None, fix: str = "") -> int:
    return integer(name, value, minimum=1, maximum=maximum, fix=fix)


def non_negative_int(name: str, value: Any, *, maximum: int | None = None, fix: str = "") -> int:
    return integer(name, value, minimum=0, maximum=maximum, fix=fix)


def finite_float(name: str, value: Any, *, minimum: float | None = None, maximum: float | None = None,
                 exclusive_minimum: bool = False, fix: str = "") -> float:
    """`value` as a finite float within its bounds (nan and inf refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{name}={value!r}: expected a number (no quotes){_fix(fix)}")
    if not math.isfinite(value):
        raise UserError(f"{name}={value}: must be a finite number{_fix(fix)}")
    low = minimum is not None and (value <= minimum if exclusive_minimum else value < minimum)
    if low or (maximum is not None and value > maximum):
        bound = ([f"{'above' if exclusive_minimum else 'at least'} {minimum:g}"] if minimum is not None else []) + \
            ([f"at most {maximum:g}"] if maximum is not None else [])
        raise UserError(f"{name}={value:g}: must be {' and '.join(bound)}{_fix(fix)}")
    return float(value)


def one_of(name: str, value: Any, choices: tuple) -> Any:
    if value not in choices:
        raise UserError(f"{name}={value!r}: choose one of {', '.join(map(repr, choices))}.")
    return value


def token_ids(name: str, value: Any, vocab_size: int, max_length: int | None = None) -> np.ndarray:
    """`value` as int32 token ids [rows, length]: integers in [0, vocab_size), at most `max_length` per row."""
    try:
        ids = np.asarray(value)
    except ValueError:
        ids = np.asarray(value, dtype=object)
    if ids.ndim != 2 or 0 in ids.shape or ids.dtype.kind not in "iu":
        raise UserError(f"{name}: expected integer token ids [batch, length], rows of one length (one row: "
                        f"np.array([ids])); got {_described(ids)}.")
    outside = ids[(ids < 0) | (ids >= vocab_size)]
    if outside.size:
        raise UserError(f"{name} holds id {outside[0]}, outside the model's {vocab_size}-id vocabulary (0 to "
                        f"{vocab_size - 1}): give ids of the model's tokenizer.")
    if max_length is not None and ids.shape[1] > max_length:
        raise UserError(f"{name} has {ids.shape[1]} tokens per row but the model takes at most {max_length} (its "
                        "max_len): shorten the rows.")
    return ids.astype(np.int32)


def _described(array: np.ndarray) -> str:
    return f"{array.dtype} values of shape {array.shape}" if array.dtype != object else "rows of different lengths"


def existing_file(name: str, path: str) -> str:
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise UserError(f"{name}={path}: {what}; give the path of a file.")
    return path


def writable_dir(name: str, path: str) -> str:
    """`path` is a directory this process can write in, or can be created (nothing is created)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{name}={path} is a file, not a directory; give a directory path.")
    _probe(name, path if os.path.isdir(path) else _nearest_existing(name, path, path), path)
    return path


def writable_file(name: str, path: str, *, suffixes: tuple[str, ...] = (), value: str | None = None) -> str:
    """`path` can be written as a file: not a directory, its directory writable or creatable, and, when
    `suffixes` are given, ending in one of them. Errors show `name`=`value` (default: the path)."""
    value = path if value is None else value
    if path.endswith(("/", os.sep)):
        raise UserError(f"{name}={value} ends with a separator, so it names a folder; give a file path, e.g. "
                        f"{name}={os.path.join(path, 'NAME' + (suffixes[0] if suffixes else ''))}.")
    if suffixes and not path.lower().endswith(suffixes):
        raise UserError(f"{name}={value}: the file name must end in {' or '.join(suffixes)}.")
    if os.path.isdir(path):
        raise UserError(f"{name}={value} is a directory; give a file path.")
    parent = os.path.dirname(os.path.abspath(path))
    _probe(name, parent if os.path.isdir(parent) else _nearest_existing(name, parent, value), value)
    return path


def output_file(name: str, path: str, *, suffixes: tuple[str, ...] = (), value: str | None = None) -> str:
    """`path` is a file this CLI may write (writable_file), not inside any run's checkpoints; its folder is
    created now, before the work, so a result is never computed only to be lost."""
    writable_file(name, path, suffixes=suffixes, value=value)
    outside_checkpoints(name, path, value=value)
    _make_dirs(name, os.path.dirname(os.path.abspath(path)), path if value is None else value)
    return path


def output_prefix(name: str, prefix: str, suffixes: tuple[str, ...]) -> str:
    """`prefix` starts the names of files this CLI writes (PREFIX.bin, ...: output_file each), and is not a folder
    or a path ending in a separator (whose files would be hidden ones, `.bin`, inside it)."""
    if prefix.endswith(("/", os.sep)) or os.path.isdir(prefix):
        example = os.path.join(prefix, "corpus")
        raise UserError(f"{name}={prefix} names a folder, but it is the start of the files' names "
                        f"({', '.join('PREFIX' + s for s in suffixes)}); give one inside it, e.g. {name}={example} "
                        f"writes {example}{suffixes[0]}.")
    for suffix in suffixes:
        output_file(name, prefix + suffix, value=prefix)
    return prefix


def output_dir(name: str, path: str, *, new_folder_for: str = "") -> str:
    """`path` is a directory this CLI may write into (writable_dir), not inside any run's checkpoints, and,
    when `new_folder_for` names what goes there (e.g. 'the Hugging Face files'), not a run's MODEL_DIR."""
    writable_dir(name, path)
    outside_checkpoints(name, path)
    if new_folder_for and os.path.isdir(path) and _is_run(path):
        raise UserError(f"{name}={path} is a training run's MODEL_DIR: {new_folder_for} would mix with the run's "
                        f"files; give a new directory, e.g. {name}={os.path.join(path, 'hf')}")
    return path


def outside_checkpoints(name: str, path: str, *, value: str | None = None) -> str:
    """Refuse `path` (a file or folder to write) inside a run's checkpoints folder or one of its steps: a
    reader then finds the checkpoint damaged (or holding files that are not its own)."""
    value = path if value is None else value
    ancestor = os.path.realpath(path)
    while True:
        checkpoints_dir = ancestor if _is_checkpoints(ancestor) else \
            os.path.dirname(ancestor) if _is_step(ancestor) else None
        if checkpoints_dir:
            run = os.path.dirname(checkpoints_dir)
            base = os.path.basename(os.path.normpath(path))
            base = f"export_{base}" if base == CHECKPOINT_SUBDIR or base.isdigit() else base
            raise UserError(f"{name}={value} is inside {checkpoints_dir}, the checkpoints of the run in {run}: "
                            "writing there changes a checkpoint that every reader verifies; write outside it, "
                            f"e.g. {name}={os.path.join(run, base)}")
        parent = os.path.dirname(ancestor)
        if parent == ancestor:
            return path
        ancestor = parent


def _is_step(directory: str) -> bool:
    return os.path.isfile(os.path.join(directory, STEP_MARKER))


def _is_checkpoints(directory: str) -> bool:
    if os.path.basename(directory) != CHECKPOINT_SUBDIR or not os.path.isdir(directory):
        return False
    try:
        return any(_is_step(entry.path) for entry in os.scandir(directory) if entry.is_dir())
    except OSError:
        return False


def _is_run(directory: str) -> bool:
    return _is_checkpoints(os.path.join(directory, CHECKPOINT_SUBDIR)) or \
        any(os.path.exists(os.path.join(directory, marker)) for marker in RUN_MARKERS)


def _make_dirs(name: str, directory: str, value: str) -> None:
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise UserError(f"{name}={value}: cannot create {directory} ({e.strerror}); give a writable path.") from None


def _nearest_existing(name: str, start: str, value: str) -> str:
    """`start` or its closest existing ancestor, which must be a directory for `start` to be created."""
    ancestor = os.path.abspath(start)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UserError(f"{name}={value}: {ancestor} is a file, so {start} cannot be created; give another path.")
    return ancestor


def _probe(name: str, directory: str, path: str) -> None:
    """Create and delete a temporary file in `directory` (permissions alone mislead root and /proc)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise UserError(f"{name}={path}: cannot write in {directory} ({e.strerror}); give a writable path.") from None


def _range(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" between {minimum} and {maximum}"
    if minimum is not None:
        return {0: " >= 0", 1: " >= 1 (a positive integer)"}.get(minimum, f" >= {minimum}")
    return f" <= {maximum}" if maximum is not None else ""


def _fix(fix: str) -> str:
    return f"; {fix}" if fix else "."
