"""The one way a test reaches `../shared/data` (real tokenizers, WikiText, LAMBADA; see its SOURCE notes).

A fresh clone has no `../shared` beside it, and its suite must pass: `shared_file(...)` hands out a path inside it
or skips the test with the reason. A test that reads under it some other way fails (tests/conftest.py watches
every file a test opens), so the suite cannot again depend on data a newcomer lacks.
"""
from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = (Path(__file__).resolve().parents[2].parent / "shared" / "data").resolve()
_reached = {"by_helper": False}


def shared_file(*parts: str) -> Path:
    """`../shared/data/<parts>`, or skip the calling test when it is absent (a fresh clone has none)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path} (../shared/data, absent here): the real tokenizers and corpora live there")
    _reached["by_helper"] = True
    return path


def shared_file_if_present(*parts: str) -> Path | None:
    """`../shared/data/<parts>` when present, else None: for a test that uses it only when it is there."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        return None
    _reached["by_helper"] = True
    return path


def needs_shared(*parts: str) -> pytest.MarkDecorator:
    """A mark for a test (or a module's `pytestmark`) that reads `../shared/data/<parts>`: tests/conftest.py skips
    it, with the reason, when that is absent."""
    return pytest.mark.shared_data(*parts)


def start_test() -> None:
    _reached["by_helper"] = False


def mark_reached() -> None:
    _reached["by_helper"] = True


def reached_by_helper() -> bool:
    return _reached["by_helper"]


def is_shared(path: str | bytes | int) -> bool:
    """Whether an opened path lies under ../shared/data (resolved only when it names "shared" at all)."""
    if isinstance(path, int):
        return False
    text = path.decode(errors="replace") if isinstance(path, bytes) else str(path)
    if "shared" not in text:
        return False
    return text.startswith(str(SHARED_DATA)) or str(Path(text).resolve()).startswith(str(SHARED_DATA))
