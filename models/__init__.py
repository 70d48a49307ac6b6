"""Flax model families and the family registry, derived from the family modules (models/registry.py).

`FAMILIES` maps a family name to (config class, module class, kind), as each models/<family>.py declares it in
its own `FAMILIES`; nothing here lists the families. The kind says which LanguageModel wraps the module
(t5x_like/lm/): 'decoder_only', 'encoder_decoder' or 'encoder_only'. configs/ and t5x_like/convert/ find their
presets and converters the same way (a test checks that the three agree). `build_model(config)` turns a config
into its module.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn

from models.config import DTYPES, FamilyConfig
from models.registry import KINDS, Family, discover_families

__all__ = ["DTYPES", "FAMILIES", "Family", "FamilyConfig", "KINDS", "build_model", "config_from_dict", "family_of"]


FAMILIES: dict[str, Family] = discover_families(__name__)


def family_of(config: FamilyConfig) -> Family:
    return FAMILIES[config.family]


def config_from_dict(values: Mapping[str, Any]) -> FamilyConfig:
    """The family's config dataclass from a plain mapping (e.g. a checkpoint's config.json)."""
    family = values.get("family")
    if family not in FAMILIES:
        raise ValueError(f"model family {family!r} is unknown; known families: {sorted(FAMILIES)}.")
    config_cls = FAMILIES[family].config
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{family} config has unknown fields {unknown}; known fields: {sorted(names)}.")
    return config_cls(**values)


def build_model(config: FamilyConfig) -> nn.Module:
    """The Flax module for a family config dataclass."""
    return family_of(config).module(config)
