"""Flax model families. `build_model(config_dict)` turns a stored config into a module."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.linen as nn

from models import gpt2

FAMILIES = {"gpt2": (gpt2.GPT2Config, gpt2.GPT2)}


def config_from_dict(values: Mapping[str, Any]):
    """The family's config dataclass from a plain mapping (e.g. a checkpoint's config.json)."""
    family = values.get("family")
    if family not in FAMILIES:
        raise ValueError(f"model family {family!r} is unknown; known families: {sorted(FAMILIES)}.")
    config_cls, _ = FAMILIES[family]
    names = {f.name for f in dataclasses.fields(config_cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{family} config has unknown fields {unknown}; known fields: {sorted(names)}.")
    return config_cls(**values)


def build_model(config) -> nn.Module:
    """The Flax module for a family config dataclass."""
    _, module_cls = FAMILIES[config.family]
    return module_cls(config)
