"""Checks of user-given values, one helper per kind, each raising a one-line UserError that names the
value and the fix. CLIs and gin configurables call them where the value enters, before any work.

    positive_int('--batch_size', args.batch_size)
    finite_float('LEARNING_RATE', learning_rate, minimum=0.0)
    writable_file('--output', args.output)      # before the work, not after it
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Any

from t5x_like.errors import UserError


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


def existing_file(name: str, path: str) -> str:
    if not os.path.isfile(path):
        what = "is a directory" if os.path.isdir(path) else "does not exist"
        raise UserError(f"{name}={path}: {what}; give the path of a file.")
    return path


def tokenizer(name: str, path: str):
    """The tokenizer at `path`; a file the tokenizer libraries cannot read is named, not a traceback."""
    from t5x_like.data.tokenizer import load_tokenizer

    try:
        return load_tokenizer(path)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - tokenizers / sentencepiece raise plain Exceptions for bad files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{name}={path}: not a readable tokenizer ({reason}); give the tokenizer.json, GPT-2 "
                        "BPE files, vocab.txt or sentencepiece .model the data was made with.") from None


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
    if suffixes and not path.lower().endswith(suffixes):
        raise UserError(f"{name}={value}: the file name must end in {' or '.join(suffixes)}.")
    if os.path.isdir(path):
        raise UserError(f"{name}={value} is a directory; give a file path.")
    parent = os.path.dirname(os.path.abspath(path))
    _probe(name, parent if os.path.isdir(parent) else _nearest_existing(name, parent, value), value)
    return path


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
