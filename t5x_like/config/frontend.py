"""Gin on the command line: the run files (files.py) and `--gin.NAME=VALUE` parsed and checked once, EPOCHS resolved,
and the run's settings (settings.py) handed to the command; the macros' documentation, quoting hints and merged
overrides. The operative configuration (every setting, defaults included) is operative.py's.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import os
import re
import sys
from typing import Any, Callable

import gin
from absl import logging
from gin import config as gin_config

from t5x_like.config import bindings as gin_bindings
from t5x_like.config import files as gin_files
from t5x_like.config.settings import read_batches, read_run_settings
from t5x_like.errors import USER_ERRORS, UserError
from t5x_like.run import epochs
from t5x_like.run.settings import RunSettings

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "gin")
"""The run files of a checkout (gin/); an installed package finds them in INSTALLED_GIN_DIR."""


INSTALLED_GIN_DIR = os.path.join(sys.prefix, "share", "t5x_like", "gin")
MACRO_LINE = re.compile(r"^([A-Z][A-Z0-9_]*)\s*=\s*(.*?)\s*(?:#\s?(.*))?$")
GIN_CALL_CONTEXT = re.compile(r"\n  In call to configurable '[^']*' \(<[^>]*>\)")
MERGED_BINDINGS = ("model_config.overrides",)
"""Dict-valued parameters whose command-line bindings merge key by key into the files' value."""


@dataclasses.dataclass(frozen=True)
class Macro:
    name: str
    default: str
    doc: str


def read_macros(path: str) -> list[Macro]:
    """The macros a gin file defines, with their defaults and end-of-line comments (an indented
    comment line below a macro continues its comment)."""
    macros: list[Macro] = []
    with open(path) as f:
        for line in f:
            match = MACRO_LINE.match(line.rstrip("\n"))
            if match:
                macros.append(Macro(match[1], match[2], match[3] or ""))
            elif macros and line.lstrip().startswith("#") and line.startswith(" "):
                last = macros[-1]
                macros[-1] = dataclasses.replace(last, doc=f"{last.doc} {line.strip().lstrip('#').strip()}")
    return macros


def macros_help(path: str) -> str:
    """The macros of `path` as an aligned table for --help."""
    macros = read_macros(path)
    width = max(len(m.name) for m in macros)
    default_width = max(len(m.default) for m in macros if m.default != "%gin.REQUIRED")
    defaults = [("required" if m.default == "%gin.REQUIRED" else m.default) for m in macros]
    lines = [f"  {m.name:<{width}}  {d:<{default_width}}  {m.doc}".rstrip() for m, d in zip(macros, defaults)]
    return "\n".join(lines)


def check_binding(binding: str) -> None:
    """Raise UserError when a NAME=VALUE binding's value is a bare word or path that gin cannot
    parse (a string without inner quotes), saying how to quote it."""
    name, sep, value = binding.partition("=")
    value = value.strip()
    if not sep or not value or value[0] in "@%" or "@" in value or "%" in value:
        return
    try:
        ast.literal_eval(value)
    except (ValueError, SyntaxError):
        name = name.strip()
        if value.lstrip("+-").lower() in gin_files.NON_FINITE:
            raise UserError(f"--gin.{name}={value}: {gin_files.bare_word(value)}") from None
        raise UserError(
            f"--gin.{name}={value}: {value!r} is not a gin value; a string needs quotes inside the shell's "
            f"quotes: --gin.{name}=\"'{value}'\" (in a gin file: {name} = '{value}').") from None


def apply_bindings(bindings: list[str]) -> None:
    """Apply command-line bindings in order; a dict for one of MERGED_BINDINGS updates the current dict
    (from the files or earlier bindings) key by key instead of replacing it (None clears it)."""
    for binding in bindings:
        check_binding(binding)
        name = binding.partition("=")[0].strip()
        previous = gin_bindings.value(name) if name in MERGED_BINDINGS else None
        try:
            gin.parse_config(binding)
        except (ValueError, SyntaxError) as e:  # an unknown configurable or parameter, a malformed value
            first = str(e).splitlines()[0]
            raise UserError(f"--gin.{binding.strip()}: {gin_files.with_fix(first)}") from None
        current = gin_bindings.value(name) if previous else None
        if isinstance(previous, dict) and isinstance(current, dict):
            gin_bindings.bind(name, {**previous, **current})


EXTRA_GIN_ENV = "T5X_LIKE_EXTRA_GIN"


def apply_extra_file() -> str | None:
    """Parse the gin file that $T5X_LIKE_EXTRA_GIN names, if any, after every --gin_file and --gin.NAME=VALUE,
    so its bindings have the last word (its model_config.overrides merge key by key, as command-line ones
    do). The documentation's command tests shrink each documented command with it; returns the path."""
    path = os.environ.get(EXTRA_GIN_ENV)
    if not path:
        return None
    if not os.path.isfile(path):
        raise UserError(f"{EXTRA_GIN_ENV}={path}: no such file; name a gin file or unset {EXTRA_GIN_ENV}.")
    gin_files.check_file(path, path)
    previous = {name: gin_bindings.value(name) for name in MERGED_BINDINGS}
    try:
        gin.parse_config_file(path)
    except (ValueError, ImportError, OSError, LookupError) as e:
        raise UserError(f"{EXTRA_GIN_ENV}={path}: {gin_files.located(e)}") from None
    for name, old in previous.items():
        new = gin_bindings.value(name)
        if isinstance(old, dict) and isinstance(new, dict):
            gin_bindings.bind(name, {**old, **new})
    return path


# ---------------------------------------------------------------- gin files


def plain_user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a CLI main: a UserError raised inside a gin-configured call loses the "In call to
    configurable ..." lines gin appends, so the user reads only the message."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except USER_ERRORS as e:
            # gin re-raises a proxy of the error whose text carries the call context; a new error carries on what
            # the original asks of the process (a StorageError ends it)
            plain = UserError(GIN_CALL_CONTEXT.sub("", str(e)))
            plain.ends_the_process = getattr(e, "ends_the_process", False)
            raise plain from None

    return wrapped


# ---------------------------------------------------------------- a run's configuration


def parse_gin(files: list[str], bindings: list[str], search_paths: list[str], *, printing: bool = False
              ) -> RunSettings:
    """Load gin files (bare names resolve in gin/), then apply bindings (model_config.overrides merge
    into the files' dict), rejecting unknown macros and unquoted strings, and resolve EPOCHS. A required macro left
    unset is an error, except, when `printing` (`train --print_config`), MODEL_DIR and the data's macros, which
    become None (EPOCHS is then not counted: TRAIN_STEPS waits for the data). Returns the run's settings, resolved
    once here for the command to pass down."""
    for path in [*search_paths, os.getcwd(), GIN_DIR, INSTALLED_GIN_DIR]:
        gin.add_config_file_search_path(path)
    if not files:
        raise UserError("no --gin_file given; e.g. --gin_file=quickstart.gin (files live in gin/).")
    gin_files.parse_files(files)
    for binding in bindings:
        name = binding.split("=", 1)[0].strip()
        if re.fullmatch(r"[A-Z][A-Z0-9_]*", name) and not gin_bindings.defines_macro(name):
            raise UserError(f"--gin.{name}: no gin file defines the macro {name}; check the spelling "
                            "(`--help` and gin/base.gin list the macros).")
    apply_bindings(bindings)
    unset = leave_unset(("MODEL_DIR", *data_macros())) if printing else []
    resolve_epochs(counted=not set(unset) & set(data_macros()))
    extra = apply_extra_file()
    if extra:
        logging.info("%s=%s: applied after the command line", EXTRA_GIN_ENV, extra)
    try:
        gin.finalize()
    except ValueError as e:
        required = re.match(r"(\w+)/macro\.value set to `%gin\.REQUIRED`", str(e))
        if not required:
            raise
        raise UserError(f"{required[1]} is required: pass --gin.{required[1]}=... (strings need inner "
                        f"quotes, e.g. --gin.MODEL_DIR=\"'/runs/run1'\") or set it in a gin file.") from None
    check_seq_len_is_used()
    return read_run_settings(tuple(unset), model_chosen=gin_files.chooses_model(files, bindings))


def data_macros() -> list[str]:
    """The macros data.make_source reads (DATA_PATH, TOKENIZER, ...), as the run files bind them."""
    return [repr(value)[1:] for value in gin_bindings.written("data.make_source").values()
            if isinstance(value, gin_config.ConfigurableReference) and repr(value).startswith("%")]


def leave_unset(names: tuple[str, ...]) -> list[str]:
    """Those of the macros `names` left required (%gin.REQUIRED), bound to None instead (before gin.finalize())."""
    unset = [name for name in names if is_required(gin_bindings.macro(name))]
    for name in unset:
        gin_bindings.bind_macro(name, None)
    return unset


def resolve_epochs(counted: bool = True) -> None:
    """EPOCHS, when set: TRAIN_STEPS becomes EPOCHS passes over the training split, CHECKPOINT_EVERY and
    EVAL_EVERY (unless 0) one pass (run/epochs.py counts its steps). Before gin.finalize(). Not `counted` (the data
    is not set: --print_config), the three are None: training counts them."""
    count = gin_bindings.macro("EPOCHS")
    if count is None:
        return
    if not counted:
        for name in ("TRAIN_STEPS", "CHECKPOINT_EVERY", "EVAL_EVERY"):
            gin_bindings.bind_macro(name, None)
        return
    steps = epochs.steps_per_pass(count, read_batches())
    gin_bindings.bind_macro("TRAIN_STEPS", count * steps)
    gin_bindings.bind_macro("CHECKPOINT_EVERY", steps)
    if gin_bindings.macro("EVAL_EVERY"):
        gin_bindings.bind_macro("EVAL_EVERY", steps)


def is_required(value: Any) -> bool:
    """Whether a bound value is `%gin.REQUIRED` (a macro no file or binding has set)."""
    return (isinstance(value, gin_config.ConfigurableReference)
            and value.configurable.wrapped == gin_config._retrieve_constant
            and value.scoped_configurable_fn() is gin.REQUIRED)


def check_seq_len_is_used() -> None:
    """SEQ_LEN is the decoder-only shorthand for FEATURE_LENGTHS = {'targets': SEQ_LEN}: set while the run's
    FEATURE_LENGTHS does not use it (an encoder-decoder run file), it would be silently ignored."""
    values = gin_bindings.macro_values()
    seq_len, lengths = values.get("SEQ_LEN"), values.get("FEATURE_LENGTHS")
    if seq_len is None or not isinstance(lengths, dict):
        return
    if not any(isinstance(v, gin.config.ConfigurableReference) for v in lengths.values()):
        raise UserError(f"SEQ_LEN={seq_len} is not used: the run sets FEATURE_LENGTHS={lengths} itself (SEQ_LEN is "
                        "the decoder-only shorthand for FEATURE_LENGTHS={'targets': N}); set FEATURE_LENGTHS, e.g. "
                        f"--gin.FEATURE_LENGTHS=\"{dict(lengths, targets=seq_len)}\", and leave SEQ_LEN unset.")


def usage_with_macros(doc: str) -> str:
    """The module doc for --help, followed by base.gin's macros ('%' escaped for absl's usage())."""
    base = os.path.join(GIN_DIR if os.path.isdir(GIN_DIR) else INSTALLED_GIN_DIR, "base.gin")
    macros = macros_help(base).replace("%", "%%")
    return f"{doc}\nMacros (--gin.NAME=VALUE; strings need inner quotes: --gin.RULES=\"'fsdp'\"):\n{macros}\n"
