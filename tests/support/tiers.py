"""The suite's three tiers and the rules each test keeps (enforced by tests/conftest.py, described in
docs/testing.md):

- unit: in-process; the default for a test that names no tier.
- integration (`@pytest.mark.integration`): the equivalence tables (meshes, pipeline, FP8, scan layout, golden
  checkpoints, resume), in-process.
- system (`@pytest.mark.system`): anything that starts a process (CLIs, many processes, documented commands,
  `make demo`, launch rehearsal).
- pulse (`@pytest.mark.pulse`, integration tier): two train steps per family, which `make test-fast` runs with the
  unit tier.

A test that starts a process without the system mark fails, naming the command; so does a test that opens a file
under ../shared/data without going through tests.support.shared_data (a fresh clone has none).
"""
from __future__ import annotations

import os
import sys

from tests.support import shared_data

TIERS = ("unit", "integration", "system")
PROCESS_EVENTS = {"subprocess.Popen", "os.posix_spawn", "os.fork", "os.system", "os.exec"}
LIBRARY_PROBES = ("fc-list",)
"""Processes a library starts on its own, once per machine: matplotlib lists the fonts (fc-list) when it builds its
font cache, which a fresh virtualenv lacks until the first test that draws."""
_seen: dict[str, list[str]] = {"processes": [], "shared": []}
_watching: list[bool] = []  # the audit hook, once installed (a hook cannot be removed)


def tier_of(markers: set[str]) -> str:
    """The tier a test's marks give it (unit when it names none); two tiers on one test is an error."""
    named = [tier for tier in TIERS if tier in markers]
    if len(named) > 1:
        raise ValueError(f"marked with two tiers {named}: keep one (tests/support/tiers.py)")
    return named[0] if named else "unit"


def _audit(event: str, args: tuple) -> None:
    if event == "open":
        if args and shared_data.is_shared(args[0]):
            _seen["shared"].append(os.fsdecode(args[0]))
    elif event in PROCESS_EVENTS and not _describe(args).startswith(LIBRARY_PROBES):
        _seen["processes"].append(f"{event} {_describe(args)}")


def _describe(args: tuple) -> str:
    command = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else args[:1]
    return " ".join(os.fsdecode(a) if isinstance(a, (str, bytes)) else str(a) for a in command)[:200]


def start_watching() -> None:
    """Installs the audit hook once per process (a hook cannot be removed, so never twice)."""
    if not _watching:
        sys.addaudithook(_audit)
        _watching.append(True)


def reset() -> None:
    _seen["processes"].clear()
    _seen["shared"].clear()
    shared_data.start_test()


def processes_started() -> list[str]:
    return list(_seen["processes"])


def shared_files_opened() -> list[str]:
    return list(_seen["shared"])
