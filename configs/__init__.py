"""Model presets by name, e.g. 'gpt2_small', 'pythia_160m', 'neox_20b', 't5_base', 't5_1_1_xl', 'bert_base',
'roberta_large', 'llama3_8b', 'mistral_7b', 'qwen2_0_5b'.

Each configs/<family>.py declares its own presets: `PRESETS` (their full names) and `preset(name)` (the
ml_collections config of one of them). Nothing here lists the families: every module of this package that
declares PRESETS is a presets module (errors.py declares none), and a name is looked up in the one that
declares it.
"""
from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import ml_collections

from configs.errors import PresetError


def preset_modules() -> list[ModuleType]:
    """The modules of this package that declare PRESETS, by name (subpackages and `_private` modules aside)."""
    names = sorted(info.name for info in pkgutil.iter_modules(__path__)
                   if not info.ispkg and not info.name.startswith("_"))
    modules = [importlib.import_module(f"{__name__}.{name}") for name in names]
    return [module for module in modules if hasattr(module, "PRESETS")]


def owners(modules: list[ModuleType]) -> dict[str, ModuleType]:
    """Preset name -> the module declaring it; a name two modules declare is refused."""
    owner: dict[str, ModuleType] = {}
    for module in modules:
        for name in module.PRESETS:
            if name in owner:
                raise ValueError(f"preset {name!r} is declared by both {owner[name].__name__} and {module.__name__}.")
            owner[name] = module
    return owner


_OWNERS = owners(preset_modules())
PRESETS = tuple(_OWNERS)
"""Every preset name, module by module (in the order each module declares its own)."""


def get_model_config(name: str) -> ml_collections.ConfigDict:
    """The preset of this name (e.g. 'gpt2_tiny', 'pythia_1.4b', 'neox_20b', 't5_1_1_base', 'cpm_1')."""
    module = _OWNERS.get(name)
    if module is None:
        raise PresetError(f"model preset {name!r} is unknown; known presets: {sorted(PRESETS)}.")
    return module.preset(name)
