"""What each upstream setting becomes here: the rows of docs/migrating.md's tables, declared by the translations
that use them (`translates`), so the tables and the translation cannot drift apart: a translation reading a
name its rows do not declare fails the tests, and the page's tables are rendered from these rows (a test
compares them).

A row names a setting the way each tool writes it (Megatron-LM's `--flag`, GPT-NeoX's YAML key, DeepSpeed's
dotted JSON path, BMTrain's and GPT2-Chinese's Python or command-line names) and ours in backticks: macros,
`configurable.parameter`s, `model_config.overrides` fields (`overrides.num_layers`) and CLI flags
(`generate --top_k`). A row with no `ours` has no equivalent; its note says why.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

TOOLS = ("megatron", "neox", "deepspeed", "bmtrain", "gpt2_chinese")
TOOL_TITLES = {"megatron": "Megatron-LM / CPM-Pretrain", "neox": "GPT-NeoX (YAML)", "deepspeed": "DeepSpeed (JSON)",
               "bmtrain": "BMTrain / ModelCenter", "gpt2_chinese": "GPT2-Chinese"}


@dataclasses.dataclass(frozen=True)
class Row:
    ours: tuple[str, ...]
    note: str = ""
    megatron: tuple[str, ...] = ()
    neox: tuple[str, ...] = ()
    deepspeed: tuple[str, ...] = ()
    bmtrain: tuple[str, ...] = ()
    gpt2_chinese: tuple[str, ...] = ()

    def keys(self) -> set[str]:
        """The names a migration reads for this row, normalised as upstream.Setting.key."""
        return {normalise(name) for name in self.megatron + self.neox + self.deepspeed}

    def upstream(self, tool: str) -> tuple[str, ...]:
        return getattr(self, tool)


def normalise(name: str) -> str:
    return name.lstrip("-").replace("-", "_")


ROWS: list[Row] = []
TRANSLATIONS: list[tuple[Callable, frozenset[str]]] = []


def translates(*rows: Row) -> Callable[[Callable], Callable]:
    """Register a translation with the rows it implements (the names it may read)."""

    def register(fn: Callable) -> Callable:
        ROWS.extend(rows)
        TRANSLATIONS.append((fn, frozenset().union(*(row.keys() for row in rows))))
        return fn

    return register


def documents(*rows: Row) -> None:
    """Rows with no translation of their own: settings a migration marks as having no equivalent, and the
    BMTrain / GPT2-Chinese rows (their scripts are Python, not configurations to read)."""
    ROWS.extend(rows)


def table(tool: str) -> str:
    """The markdown table of one tool's settings."""
    lines = [f"| {TOOL_TITLES[tool]} | here | notes |", "|---|---|---|"]
    for row in ROWS:
        names = row.upstream(tool)
        if not names:
            continue
        ours = ", ".join(f"`{name}`" for name in row.ours) or "no equivalent"
        lines.append(f"| {', '.join(f'`{n}`' for n in names)} | {ours} | {row.note} |")
    return "\n".join(lines)


def tables() -> dict[str, str]:
    return {tool: table(tool) for tool in TOOLS}
