"""How the family registry is derived (issue 42): a family module declares its entries, nothing lists them.

A module of the models package that is a family declares, at module level,

    FAMILIES = {"<name>": Family(<config class>, <module class>, "<kind>")}

(one module may declare several, as models/bert.py does BERT and RoBERTa). `discover_families` imports every
module of the package and collects those declarations; a module that declares none (attention.py, config.py,
this one) is no family, and subpackages (layers/, kernels/) are never families. `declaring_modules` is the same
discovery for any package and attribute: t5x_like/convert finds its converters with it.
"""
from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from types import ModuleType
from typing import Any, NamedTuple

KINDS = ("decoder_only", "encoder_decoder", "encoder_only")
"""Which LanguageModel wraps a family's module (t5x_like/lm/)."""

DECLARATION = "FAMILIES"
"""The module-level name under which a family module declares its entries."""


class Family(NamedTuple):
    config: type
    module: type
    kind: str


def package_modules(package: str) -> list[ModuleType]:
    """The modules (not subpackages, not `_private` ones such as __main__) of `package`, imported, by name."""
    path = importlib.import_module(package).__path__
    names = sorted(info.name for info in pkgutil.iter_modules(path) if not info.ispkg and not info.name.startswith("_"))
    return [importlib.import_module(f"{package}.{name}") for name in names]


def declaring_modules(package: str, attribute: str) -> dict[str, ModuleType]:
    """module name (within `package`) -> the module, for each module of `package` that declares `attribute`."""
    return {module.__name__.rpartition(".")[2]: module for module in package_modules(package)
            if hasattr(module, attribute)}


def declarations(package: str, attribute: str) -> dict[str, Any]:
    """module name -> what it declares as `attribute`, for each module of `package` that declares it."""
    return {name: getattr(module, attribute) for name, module in declaring_modules(package, attribute).items()}


def discover_families(package: str) -> dict[str, Family]:
    """Every family the modules of `package` declare (DECLARATION), checked, sorted by name."""
    declared = declarations(package, DECLARATION)
    families: dict[str, Family] = {}
    for module, entries in sorted(declared.items()):
        for name, family in entries.items():
            check_entry(f"{package}.{module}", name, family)
            if name in families:
                raise ValueError(f"{package}.{module} declares family {name!r}, which another module declares too.")
            families[name] = family
    return dict(sorted(families.items()))


def check_entry(module: str, name: str, family: Family) -> None:
    """A declared entry is a Family of a known kind whose config class names it (its `family` default)."""
    if not isinstance(family, Family):
        raise TypeError(f"{module}: {DECLARATION}[{name!r}] is a {type(family).__name__}; declare "
                        f"Family(config class, module class, kind).")
    if family.kind not in KINDS:
        raise ValueError(f"{module}: family {name!r} has kind {family.kind!r}; choose one of {list(KINDS)}.")
    default = {f.name: f.default for f in dataclasses.fields(family.config)}.get("family")
    if default != name:
        raise ValueError(f"{module}: family {name!r} is declared with {family.config.__name__}, whose `family` "
                         f"default is {default!r}; the two names must be the same.")
