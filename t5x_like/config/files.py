"""Gin files: found (a path, or a name in gin's search paths, gin/ included), decoded, syntax-checked with their
includes, then bound; any mistake is one UserError naming file:line and the fix (a retired binding names what
replaces it). Also whether the files after the run file choose the model."""
from __future__ import annotations

import difflib
import glob
import io
import os
import re
import tokenize

import gin
from gin import config as gin_config
from gin import config_parser

import configs
from t5x_like.errors import UserError

MODEL_PRESET = "model_config.preset"


NON_FINITE = ("nan", "inf", "infinity")


def bare_word(word: str) -> str:
    """Why a bare word is no gin value, and the fix: gin reads Python literals (no nan or inf), quoted strings."""
    if word.lstrip("+-").lower() in NON_FINITE:
        return f"{word} is not a value gin reads (gin has no nan or inf); write a finite number."
    return f"{word} is not a value gin reads; a string needs quotes: '{word}'."

GIN_LOCATION = re.compile(r'\n\s*In file "([^"]*)", line (\d+)')
GIN_STATEMENTS = "a gin line is NAME = VALUE, configurable.parameter = VALUE, include 'file.gin' or import module"


def parse_files(files: list[str]) -> None:
    """Parse `--gin_file`s in order (gin's search paths must be set). Every file and include is found,
    decoded and syntax-checked first, then bound: any mistake is one UserError naming file:line and the fix."""
    for name in files:
        check_file(name, resolve(name, f"--gin_file={name}"))
    for name in files:
        try:
            gin.parse_config_file(name)
        except (ValueError, ImportError, OSError, LookupError) as e:
            raise UserError(located(e)) from None


def chooses_model(files: list[str], bindings: list[str]) -> bool:
    """Whether the model is chosen after the run file (the first --gin_file): a later file, or one it includes,
    or a command-line binding sets model_config.preset (run after parse_files has checked the files)."""
    named = [binding.partition("=")[0].strip() for binding in bindings]
    return (any(name.endswith(MODEL_PRESET) for name in named)
            or any(_binds_preset(resolve(name, name)) for name in files[1:]))


def _binds_preset(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        statements = list(config_parser.ConfigParser(f, _SyntaxOnly()))
    return any(f"{s.selector}.{s.arg_name}".endswith(MODEL_PRESET) if isinstance(s, config_parser.BindingStatement)
               else isinstance(s, config_parser.IncludeStatement) and _binds_preset(resolve(s.filename, path))
               for s in statements)


def resolve(name: str, where: str) -> str:
    """The path gin reads for `name` (a path, or a name in one of its search paths), or a UserError."""
    prefixes = [""] if os.path.isabs(name) else _search_paths()
    for prefix in prefixes:
        path = os.path.join(prefix, name)
        if os.path.isfile(path):
            return path
    if any(os.path.isdir(os.path.join(prefix, name)) for prefix in prefixes):
        raise UserError(f"{where}: {name} is a directory; give a .gin file{_example(name)}.")
    preset = os.path.basename(name).removesuffix(".gin")
    if preset in configs.PRESETS:  # gin/models/ keeps only the model files documented commands add
        raise UserError(f"{where}: no gin file {name}; {preset} is a model preset: choose it with model_config.preset "
                        f"= '{preset}' in a gin file, or --gin.model_config.preset=\"'{preset}'\" after the run file.")
    searched = ", ".join(dict.fromkeys(os.path.abspath(p or ".") for p in prefixes))
    raise UserError(f"{where}: no gin file {name} (looked in {searched}){_did_you_mean(name, prefixes)}")


def check_file(name: str, path: str) -> None:
    """UTF-8, gin syntax and closed brackets in `path` and, recursively, in the files it includes."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise UserError(f"{path}:{line}: byte 0x{data[e.start]:02x} is not UTF-8; save the file as UTF-8.") from None
    try:
        statements = list(config_parser.ConfigParser(io.StringIO(text), _SyntaxOnly()))
    except SyntaxError as e:
        token = re.search(r"Failed to parse token '([^']*)'", e.msg or "")
        if token:
            raise UserError(f"{path}:{e.lineno}: `{(e.text or '').strip()}`: {bare_word(token[1])}") from None
        words = (e.text or "").split()
        hint = ("; did you mean `include`?" if words and words[0] != "include"
                and difflib.get_close_matches(words[0], ["include"], cutoff=0.7) else ".")
        raise UserError(f"{path}:{e.lineno}: {e.msg.rstrip('.')} in `{(e.text or '').strip()}` "
                        f"({GIN_STATEMENTS}){hint}") from None
    except tokenize.TokenError:
        raise UserError(f"{path}:{_unclosed(text)}") from None
    for statement in statements:
        if isinstance(statement, config_parser.IncludeStatement):
            location = f"{path}:{statement.location.line_num}: include {statement.filename!r}"
            check_file(statement.filename, resolve(statement.filename, location))


class _SyntaxOnly(config_parser.ParserDelegate):
    """Parses references and macros without resolving them (a syntax check)."""

    def configurable_reference(self, scoped_configurable_name, evaluate):
        return scoped_configurable_name

    def macro(self, macro_name):
        return macro_name


def _unclosed(text: str) -> str:
    """'LINE: ...' for the bracket a gin file leaves open (tokenize reports only the end of the file)."""
    opened: list[tuple[str, int]] = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.string in "([{" and token.type == tokenize.OP:
                opened.append((token.string, token.start[0]))
            elif token.string in ")]}" and token.type == tokenize.OP and opened:
                opened.pop()
    except tokenize.TokenError:
        pass
    if not opened:
        return f"{text.count(chr(10)) + 1}: the file ends inside a statement (an unclosed string?); close it."
    bracket, line = opened[-1]
    closing = {"(": ")", "[": "]", "{": "}"}[bracket]
    return f"{line}: `{bracket}` is never closed (the file ends inside it); add the `{closing}`."


RETIRED = {"'optim.make_optimizer' doesn't have a parameter named 'total_steps'":
           "the schedule's length is TRAIN_STEPS, bound once: remove the line (optim.make_optimizer.decay_steps sets a "
           "decay of another length)"}
"""gin's words for a binding an older run file may hold -> what replaces it."""


def located(error: Exception) -> str:
    """gin's message for a statement it could not bind, as 'file:line: message; fix'."""
    message = str(error.args[0] if isinstance(error, OSError) and error.args else error)
    match = GIN_LOCATION.search(message)
    first = message.split("\n")[0].rstrip(".")
    if not match:
        return f"{first}."
    return f"{match[1]}:{match[2]}: {first}; {_fix(first)}."


def _fix(message: str) -> str:
    """The fix for gin's `message`: what replaces a retired binding, else a spelling to check."""
    return next((fix for words, fix in RETIRED.items() if words in message),
                "check the spelling (--print_config lists every configurable parameter)")


def with_fix(message: str) -> str:
    """gin's `message` for a command-line binding, with what replaces it when the binding is a retired one."""
    retired = any(words in message for words in RETIRED)
    return f"{message.rstrip('.')}; {_fix(message)}" if retired else message


def _search_paths() -> list[str]:
    return list(dict.fromkeys(gin_config._LOCATION_PREFIXES))


def _example(directory: str) -> str:
    found = sorted(glob.glob(os.path.join(directory, "*.gin")))
    return f", e.g. {found[0]}" if found else ""


def _did_you_mean(name: str, prefixes: list[str]) -> str:
    known = {os.path.relpath(path, prefix or ".") for prefix in prefixes for pattern in ("*.gin", "*/*.gin")
             for path in glob.glob(os.path.join(prefix or ".", pattern))}
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else "; give a path, or a name from gin/ such as quickstart.gin."
