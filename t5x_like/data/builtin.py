"""The builtin corpus: Python's own documentation, so the quickstart trains with no download.

Documents are the `pydoc_data` help topics and, per standard-library module, its module, class and
function docstrings (read with `ast`, nothing is imported), in a fixed shuffled order. A byte-level BPE
with `BUILTIN_VOCAB_SIZE` ids is trained on them once; tokenizer and token file are cached under
`$T5X_LIKE_CACHE` (default `~/.cache/t5x_like`). Concurrent first uses each build into a private
directory and atomically rename it into place; the first rename wins and the others reuse it.
"""
from __future__ import annotations

import ast
import itertools
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pydoc_data.topics

from t5x_like.data.token_file import TokenFileWriter, token_dtype
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.data.tokenizer_files import cache_root
from t5x_like.data.train_tokenizer import train_byte_level_bpe

BUILTIN_VOCAB_SIZE = 8192
_VERSION = 2  # bump when the corpus or tokenizer recipe changes, to invalidate caches
_SHUFFLE_SEED = 0
_ENCODE_CHUNK = 256  # documents per encode_batch call


def cache_dir() -> Path:
    """Where the builtin corpus lives: one directory per recipe version and Python version."""
    return cache_root() / f"builtin-v{_VERSION}-py{sys.version_info.major}.{sys.version_info.minor}"


def builtin_corpus() -> tuple[str, str]:
    """(token file prefix, tokenizer path) of the builtin corpus, building it on first use."""
    final = cache_dir()
    if not (final / "corpus.json").exists():
        _build(final)
    return str(final / "corpus"), str(final / "tokenizer.json")


def builtin_documents() -> list[str]:
    """The corpus text, one string per document, in the same order on every call."""
    documents = [text for _, text in sorted(pydoc_data.topics.topics.items()) if text.strip()]
    documents += [doc for doc in itertools.starmap(_module_docstrings, _stdlib_sources()) if doc]
    order = np.random.default_rng(_SHUFFLE_SEED).permutation(len(documents))
    return [documents[i] for i in order]


def _stdlib_sources() -> Iterator[tuple[str, Path]]:
    """(dotted module name, source file) of the standard library, tests and site-packages left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if not set(parts) & {"site-packages", "dist-packages", "test", "tests"}:
            yield ".".join(parts).removesuffix(".__init__"), path


def _module_docstrings(module: str, path: Path) -> str:
    """A module's docstrings, each under the qualified name it documents; '' when it has none."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):  # a few stdlib files are deliberately invalid (lib2to3 fixtures)
        return ""
    sections = []
    for name, node in _documented_nodes(tree, module):
        docstring = ast.get_docstring(node)
        if docstring:
            sections.append(f"{name}\n\n{docstring}")
    return "\n\n".join(sections)


def _documented_nodes(node: ast.AST, name: str) -> Iterator[tuple[str, ast.AST]]:
    yield name, node
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _documented_nodes(child, f"{name}.{child.name}")


def _build(final: Path) -> None:
    logging.info("Building the builtin corpus in %s (once)", final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".tmp", dir=final.parent))
    try:
        documents = builtin_documents()
        train_byte_level_bpe(documents, BUILTIN_VOCAB_SIZE).save(str(tmp / "tokenizer.json"))
        tokenizer = load_tokenizer(tmp / "tokenizer.json")
        metadata = {"tokenizer": {"path": str(final / "tokenizer.json"), "sha256": tokenizer.sha256,
                                  "vocab_size": tokenizer.vocab_size, "eod_id": tokenizer.eod_id},
                    "append_eod": True, "sources": ["builtin: pydoc_data.topics + stdlib docstrings"]}
        with TokenFileWriter(tmp / "corpus", token_dtype(tokenizer.vocab_size), metadata) as writer:
            for start in range(0, len(documents), _ENCODE_CHUNK):
                writer.write(*tokenizer.encode_documents(documents[start:start + _ENCODE_CHUNK], append_eod=True))
        tmp.chmod(0o755)
        os.rename(tmp, final)
    except OSError:
        if not (final / "corpus.json").exists():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
