"""Corpus readers: files in the shapes users bring, read as a stream of document strings.

Formats (`--format`; `auto` decides per file from its name, after dropping `.gz` / `.zst`):
  text           one document per file (`*.txt`)
  jsonl          one JSON object per line, the document is the value of `--json_keys` (`*.jsonl`,
                 `*.json` not starting with `[`; The Pile shards `*.jsonl.zst`)
  json_array     one JSON array of strings or objects (`*.json` starting with `[`; GPT2-Chinese train.json),
                 parsed incrementally
  wikiextractor  WikiExtractor output files (`wiki_00` ...), `<doc ...>` blocks or `--json` lines
  wikitext       WikiText `*.tokens` / `*.raw`: one document per ` = Title = ` article
Bad input raises `InputError` naming the file (and line), the value and the fix.
"""
from __future__ import annotations

import codecs
import collections
import glob
import gzip
import io
import itertools
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import zstandard

from t5x_like.errors import UserError

FORMATS = ["auto", "text", "jsonl", "json_array", "wikiextractor", "wikitext"]
_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")
_WIKIEXTRACTOR_NAME = re.compile(r"^wiki_\d+$")
_CHUNK = 1 << 20
BOM = "\ufeff"


class InputError(UserError):
    """Corpus input that cannot be read as configured; the message names the file and the fix."""


def expand_inputs(specs: Sequence[str]) -> list[str]:
    """Files named by `specs` (files, directories searched recursively, globs), sorted within each spec."""
    paths = []
    for spec in specs:
        matches = sorted(glob.glob(spec, recursive=True)) if glob.has_magic(spec) else [spec]
        found = [f for m in matches for f in _files_under(m)]
        if not found:
            problem = "the directory holds no files (hidden ones are skipped)" if os.path.isdir(spec) \
                else "no such file, directory or matching glob"
            raise InputError(f"--input={spec}: {problem}")
        paths += found
    return paths


def _files_under(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    return sorted(str(p) for p in Path(path).rglob("*") if p.is_file() and not p.name.startswith("."))


def read_documents(paths: Sequence[str], fmt: str = "auto", json_keys: Sequence[str] = ("text",),
                   decode_errors: str = "strict", stats: collections.Counter | None = None) -> Iterator[str]:
    """Yields the non-empty documents of `paths` in order; a file without any is an error.

    A UTF-8 byte-order mark (U+FEFF) opening a file or a document is dropped, as `utf-8-sig` readers drop
    it; `stats` (when given) counts them ('bom'), the NUL characters the documents keep ('nul', in
    'nul_documents'; 'nul_first': the first file holding one)."""
    stats = collections.Counter() if stats is None else stats
    for path in paths:
        reader = _READERS[detect_format(path) if fmt == "auto" else fmt]
        with _open_decompressed(path) as f:
            stats["bom"] += _starts_with_bom(f)
        count = 0
        for document in reader(path, json_keys, decode_errors):
            if document.startswith(BOM):
                document = document[1:]
                stats["bom"] += 1
            nul = document.count("\0")
            if nul:
                stats["nul"] += nul
                stats["nul_documents"] += 1
                stats.setdefault("nul_first", path)
            if document:
                count += 1
                yield document
        if count == 0:
            raise InputError(f"{path}: no documents (empty file?); remove it from --input")


def nul_warning(stats: collections.Counter, became: str) -> str | None:
    """One line on the NUL characters (U+0000) read_documents counted in `stats`, naming the file and line of the
    first and what `became` of them; None when there were none."""
    if not stats["nul"]:
        return None
    path = stats["nul_first"]
    return (f"warning: {path}:{first_nul_line(path)}: {stats['nul']:,} NUL characters (U+0000) in "
            f"{stats['nul_documents']:,} documents (the first here) {became}; a binary or UTF-16 file among the "
            "inputs? Remove them from the corpus if unintended")


def first_nul_line(path: str) -> int | None:
    """The line of `path` holding its first NUL character: a NUL byte, or JSON's \\u0000 escape."""
    with open_binary(path) as f:
        for number, line in enumerate(f, 1):
            if b"\x00" in line or b"\\u0000" in line:
                return number
    return None


def detect_format(path: str) -> str:
    name = _strip_compression(Path(path).name)
    suffix = Path(name).suffix
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".json":
        with open_binary(path) as f:
            return "json_array" if f.read(4096).lstrip()[:1] == b"[" else "jsonl"
    if suffix in (".tokens", ".raw"):
        return "wikitext"
    if _WIKIEXTRACTOR_NAME.match(name):
        return "wikiextractor"
    if suffix == ".txt":
        return "text"
    raise InputError(f"{path}: cannot tell the format from the name; pass --format= one of {FORMATS[1:]}")


def _strip_compression(name: str) -> str:
    for suffix in (".gz", ".zst"):
        if name.endswith(suffix):
            return name[:-len(suffix)]
    return name


def open_binary(path: str) -> BinaryIO:
    """The file's bytes, decompressed when it ends in .gz or .zst, without a leading UTF-8 byte-order mark."""
    f = _open_decompressed(path)
    if _starts_with_bom(f):
        f.read(len(codecs.BOM_UTF8))
    return f


def _open_decompressed(path: str) -> BinaryIO:
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".zst"):
        decompressor = zstandard.ZstdDecompressor(max_window_size=1 << 31)  # files made with zstd --long
        return io.BufferedReader(decompressor.stream_reader(open(path, "rb"), read_across_frames=True))
    return open(path, "rb")


def _starts_with_bom(f) -> bool:
    return f.peek(len(codecs.BOM_UTF8))[:len(codecs.BOM_UTF8)] == codecs.BOM_UTF8


def _decode(data: bytes, path: str, line: int, errors: str) -> str:
    try:
        return data.decode("utf-8", errors)
    except UnicodeDecodeError as e:
        line += data.count(b"\n", 0, e.start)
        raise InputError(f"{path}:{line}: bytes that are not UTF-8 ({data[e.start:e.end]!r}); pass "
                         "--decode_errors=replace to replace them with U+FFFD") from None


def _lines(path: str, errors: str) -> Iterator[tuple[int, str]]:
    with open_binary(path) as f:
        for number, raw in enumerate(f, 1):
            yield number, _decode(raw, path, number, errors)


def _read_text(path: str, keys: Sequence[str], errors: str) -> Iterator[str]:
    with open_binary(path) as f:
        yield _decode(f.read(), path, 1, errors)


def _document_from_json(value, path: str, line: int, keys: Sequence[str]) -> str:
    if isinstance(value, str):
        return value
    if not isinstance(value, dict):
        raise InputError(f"{path}:{line}: expected a JSON object or string, got {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    if missing:
        raise InputError(f"{path}:{line}: no key {missing[0]!r} (keys: {', '.join(value)}); "
                         "pass --json_keys= the key(s) holding the text")
    texts = [value[k] for k in keys]
    if not all(isinstance(t, str) for t in texts):
        raise InputError(f"{path}:{line}: the value of {list(keys)} must be strings, got {texts!r:.80}")
    return "\n\n".join(texts)


def _read_jsonl(path: str, keys: Sequence[str], errors: str) -> Iterator[str]:
    for number, line in _lines(path, errors):
        if line.strip():
            yield _document_from_json(_json_line(line, path, number), path, number, keys)


def _json_line(line: str, path: str, number: int):
    try:
        return json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{number}: invalid JSON at column {e.colno} ({e.msg}); "
                         "fix or remove the line") from None


def _read_json_array(path: str, keys: Sequence[str], errors: str) -> Iterator[str]:
    """Elements of one top-level JSON array, decoded incrementally so memory stays bounded."""
    with open_binary(path) as f:
        array = _IncrementalJson(f, path, errors)
        if array.next_char() != "[":
            raise InputError(f"{path}:{array.line()}: expected a JSON array, found {array.next_char()!r}")
        array.pos += 1
        if array.next_char() == "]":
            return
        while True:
            array.next_char()
            line = array.line()
            yield _document_from_json(array.value(), path, line, keys)
            char = array.next_char()
            array.pos += 1
            if char == "]":
                return
            if char != ",":
                raise InputError(f"{path}:{array.line()}: expected ',' or ']' after an array element, "
                                 f"found {char or 'the end of the file'!r}")


class _IncrementalJson:
    """A text buffer over a binary stream, refilled a chunk at a time, that knows its line numbers."""

    def __init__(self, f: BinaryIO, path: str, errors: str):
        self.f, self.path = f, path
        self.text = codecs.getincrementaldecoder("utf-8")(errors)
        self.buffer, self.pos, self.eof = "", 0, False
        self._line, self._counted = 1, 0  # line number at buffer position _counted

    def line(self) -> int:
        self._line += self.buffer.count("\n", self._counted, self.pos)
        self._counted = self.pos
        return self._line

    def _refill(self) -> bool:
        self.line()
        self.buffer, self.pos, self._counted = self.buffer[self.pos:], 0, 0
        if self.eof:
            return False
        chunk = self.f.read(_CHUNK)
        self.eof = not chunk
        try:
            self.buffer += self.text.decode(chunk, final=self.eof)
        except UnicodeDecodeError:
            raise InputError(f"{self.path}:{self.line()}: bytes that are not UTF-8 after this line; pass "
                             "--decode_errors=replace to replace them with U+FFFD") from None
        return True

    def next_char(self) -> str:
        """The next non-space character without consuming it; '' at the end of the file."""
        while True:
            while self.pos < len(self.buffer) and self.buffer[self.pos].isspace():
                self.pos += 1
            if self.pos < len(self.buffer) or not self._refill():
                return self.buffer[self.pos:self.pos + 1]

    def value(self):
        while True:
            try:
                value, self.pos = _JSON.raw_decode(self.buffer, self.pos)
                return value
            except json.JSONDecodeError as e:
                if self.eof:
                    line = self.line() + self.buffer.count("\n", self.pos, e.pos)
                    raise InputError(f"{self.path}:{line}: invalid JSON ({e.msg}); fix the array element") from None
                self._refill()


def _read_wikiextractor(path: str, keys: Sequence[str], errors: str) -> Iterator[str]:
    """`<doc id=.. title=..>` blocks (the title line kept), or JSON lines when run with --json."""
    lines = _lines(path, errors)
    for number, line in lines:
        if line.startswith("{"):
            for n, text in itertools.chain([(number, line)], lines):
                if text.strip():
                    yield _document_from_json(_json_line(text, path, n), path, n, keys)
            return
        if line.startswith("<doc"):
            yield _wikiextractor_doc(lines, path, number)
        elif line.strip():
            raise InputError(f"{path}:{number}: expected '<doc ...>' or a JSON line in WikiExtractor output, "
                             f"found {line[:40]!r}; pass the right --format")


def _wikiextractor_doc(lines: Iterator[tuple[int, str]], path: str, start: int) -> str:
    body = []
    for _, line in lines:
        if line.startswith("</doc>"):
            return "".join(body).strip()
        body.append(line)
    raise InputError(f"{path}:{start}: '<doc' without a closing '</doc>' (truncated file?)")


def _read_wikitext(path: str, keys: Sequence[str], errors: str) -> Iterator[str]:
    article: list[str] = []
    for _, line in _lines(path, errors):
        if _WIKITEXT_TITLE.match(line.rstrip("\n")):
            if "".join(article).strip():
                yield "".join(article)
            article = []
        article.append(line)
    if "".join(article).strip():
        yield "".join(article)


_JSON = json.JSONDecoder()
_READERS: dict[str, Callable[[str, Sequence[str], str], Iterator[str]]] = {
    "text": _read_text, "jsonl": _read_jsonl, "json_array": _read_json_array,
    "wikiextractor": _read_wikiextractor, "wikitext": _read_wikitext,
}
