"""Upstream settings -> a gin run file: each translation (model, parallelism and batch, schedule and
optimizer, precision, run and data) adds bindings with the upstream setting each came from; what has no
equivalent is listed with the reason, and what no translation knows is listed as not recognised."""
from __future__ import annotations

import dataclasses
import importlib
import math
from typing import Any

from t5x_like.errors import UserError
from t5x_like.migration import rows
from t5x_like.migration.upstream import Setting, Upstream

SECTIONS = ("model", "mesh and batch", "schedule and optimizer", "precision", "run and data")
TRANSLATION_MODULES = ("t5x_like.migration.model", "t5x_like.migration.batch", "t5x_like.migration.recipe",
                       "t5x_like.migration.moe_parallel", "t5x_like.migration.run",
                       "t5x_like.migration.ignored", "t5x_like.migration.habits")
DEFAULT_OF = {"megatron": "Megatron-LM's default", "neox": "GPT-NeoX's default", "deepspeed": "DeepSpeed's default"}


def provenance(setting: Setting | None, default: str = "") -> str:
    """Where a value came from: `--lr 1.5e-4 (run_gpt2.sh:61)`, or the upstream default it takes."""
    if setting is None:
        return default
    value = "" if setting.value is True else f" {shown(setting.value)}"
    return f"{setting.spelled}{value} ({setting.where})"


def shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


@dataclasses.dataclass
class Binding:
    name: str
    value: Any
    why: str
    section: str


class Out:
    """The gin file being written: bindings by section, model_config.overrides, and what is left out."""

    def __init__(self, upstream: Upstream):
        self.upstream = upstream
        self.section = SECTIONS[0]
        self.bindings: list[Binding] = []
        self.overrides: dict[str, tuple[Any, str]] = {}
        self.skipped: list[tuple[str, str]] = []  # (setting as written, reason)
        self.notes: list[str] = []

    def default(self) -> str:
        return DEFAULT_OF[self.upstream.kind]

    def set(self, name: str, value: Any, why: str) -> None:
        check_finite(value, why)
        self.bindings = [b for b in self.bindings if b.name != name]
        self.bindings.append(Binding(name, value, why, self.section))

    def override(self, field: str, value: Any, why: str) -> None:
        check_finite(value, why)
        self.overrides[field] = (value, why)

    def skip(self, setting: Setting | None, reason: str) -> None:
        if setting is not None:
            self.skipped.append((provenance(setting), reason))

    def value(self, name: str) -> Any:
        return next((b.value for b in self.bindings if b.name == name), None)


def check_finite(value: Any, why: str) -> None:
    """Refuse a value gin cannot write (nan, inf: gin reads Python literals), naming where it came from."""
    values = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else [value]
    for item in values:
        if isinstance(item, (dict, list, tuple)):
            check_finite(item, why)
        elif isinstance(item, float) and not math.isfinite(item):
            raise UserError(f"{why}: {item} is not a finite number; fix the value.")


def load_translations() -> None:
    """Import the modules that register translations and their rows (they import this module)."""
    for module in TRANSLATION_MODULES:
        importlib.import_module(module)


def translate(upstream: Upstream) -> Out:
    """Run every translation; the names each reads must be among its rows' (so docs/migrating.md's tables,
    rendered from the rows, name every setting a migration reads)."""
    load_translations()
    out = Out(upstream)
    for fn, allowed in rows.TRANSLATIONS:
        upstream.allowed = allowed
        try:
            fn(upstream, out)
        finally:
            upstream.allowed = None
    for setting in upstream.unused():
        out.skip(setting, "not recognised by this migration: check it by hand")
    return out


def render(out: Out, command: str) -> str:
    """The gin file's text."""
    upstream = out.upstream
    lines = [f"# Migrated by `{command}` from:"]
    lines += [f"#   {path}" for path in upstream.files]
    lines += ["# Every value below names the upstream setting it came from; settings with no equivalent are listed",
              "# at the end with the reason. Check the result with:",
              "#   python -m t5x_like.train --gin_file=THIS_FILE --print_config", "include 'base.gin'"]
    for section in SECTIONS:
        bindings = [b for b in out.bindings if b.section == section]
        if not bindings and not (section == "model" and out.overrides):
            continue
        lines += ["", f"# ---- {section}"]
        lines += [line for b in bindings for line in binding_lines(b)]
        if section == "model" and out.overrides:
            lines.append("model_config.overrides = {")
            lines += [f"    {field!r}: {value!r},  # {why}" for field, (value, why) in out.overrides.items()]
            lines.append("}")
    if out.notes or upstream.notes:
        lines += ["", "# ---- read but not evaluated"] + [f"# {note}" for note in upstream.notes + out.notes]
    if out.skipped:
        lines += ["", "# ---- not migrated (no equivalent here, or not recognised)"]
        lines += [f"# {what}: {reason}" for what, reason in out.skipped]
    return "\n".join(lines) + "\n"


def binding_lines(binding: Binding) -> list[str]:
    value = "%gin.REQUIRED" if binding.value is REQUIRED else repr(binding.value)
    return [f"{binding.name} = {value}  # {binding.why}"]


REQUIRED = object()
"""A binding the upstream files leave to the user (an empty --save): written as %gin.REQUIRED."""
