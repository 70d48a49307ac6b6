"""docs/migrating.md's tables of upstream settings cannot go stale: the page holds exactly what
`python -m t5x_like.migrate --settings_table` renders from the rows the migration reads, and every setting of
ours a row names exists (a base.gin macro, a configurable's parameter, a model config field, a CLI flag)."""
import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path

import gin
import pytest

from t5x_like.config import frontend
from t5x_like.migration import rows, translate

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "migrating.md"
BEGIN, END = "<!-- begin settings tables -->\n", "<!-- end settings tables -->"


@pytest.mark.system
def test_the_page_holds_the_tables_the_migration_renders():
    printed = subprocess.run([sys.executable, "-m", "t5x_like.migrate", "--settings_table"], capture_output=True,
                             text=True, check=True).stdout
    text = PAGE.read_text(encoding="utf-8")
    page = text[text.index(BEGIN) + len(BEGIN):text.index(END)]
    assert page == printed, ("docs/migrating.md's tables differ from `python -m t5x_like.migrate --settings_table`; "
                             "paste its output between the markers")
    for tool in rows.TOOLS:
        assert f"### {rows.TOOL_TITLES[tool]}" in page


def model_fields() -> set[str]:
    import models

    return {field.name for family in models.FAMILIES.values() for field in dataclasses.fields(family.config)}


def cli_flags(module: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", f"t5x_like.{module}", "--help"], capture_output=True, text=True)
    return set(re.findall(r"(--[a-z_]+)", done.stdout))


def configurable_parameter(name: str) -> bool:
    configurable, _, parameter = name.rpartition(".")
    match = gin.config._REGISTRY.get_match(configurable)
    if match is None:
        return False
    fn = match.wrapped
    return parameter in inspect.signature(fn.__init__ if inspect.isclass(fn) else fn).parameters


@pytest.mark.system
def test_every_setting_of_ours_a_row_names_exists():
    import t5x_like.train  # noqa: F401 (registers the gin configurables)

    translate.load_translations()
    macros = {m.name for m in frontend.read_macros(str(REPO / "gin" / "base.gin"))}
    fields = model_fields()
    flags = {"generate": cli_flags("generate"), "train": {"--coordinator_address"}}
    missing = []
    for row in rows.ROWS:
        for name in row.ours:
            command, _, flag = name.partition(" ")
            exists = (name in macros if name.isupper() else
                      name.removeprefix("overrides.") in fields if name.startswith("overrides.") else
                      flag in flags[command] if flag else configurable_parameter(name))
            if not exists:
                missing.append(name)
    assert not missing, f"rows name settings that do not exist here: {sorted(set(missing))}"


def test_every_row_names_an_upstream_setting_and_a_reason_when_it_has_no_equivalent():
    translate.load_translations()
    for row in rows.ROWS:
        assert any(row.upstream(tool) for tool in rows.TOOLS), row
        assert row.ours or row.note, row


@pytest.mark.parametrize("tool", rows.TOOLS)
def test_each_tool_has_its_table(tool):
    translate.load_translations()
    table = rows.table(tool).splitlines()
    assert table[0].startswith(f"| {rows.TOOL_TITLES[tool]} |") and len(table) > 5
