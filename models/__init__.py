"""Flax model families and the family registry: the one list of families.

`FAMILIES` maps a family name to (config class, module class, kind). The kind says which
LanguageModel wraps the module (t5x_like/lm.py): 'decoder_only', 'encoder_decoder' or 'encoder_only'.
configs/ and t5x_like/convert/ register presets and converters against these names (a test
checks that the three agree). `build_model(config)` turns a config into its module.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, NamedTuple

import flax.linen as nn

from models import bert, gpt2, llama, neox, t5
from models.config import DTYPES, FamilyConfig

KINDS = ("decoder_only", "encoder_decoder", "encoder_only")


class Family(NamedTuple):
    config: type[FamilyConfig]
    module: type[nn.Module]
    kind: str


FAMILIES: dict[str, Family] = {
    "gpt2": Family(gpt2.GPT2Config, gpt2.GPT2, "decoder_only"),
    "neox": Family(neox.NeoXConfig, neox.NeoX, "decoder_only"),
    "llama": Family(llama.LlamaConfig, llama.Llama, "decoder_only"),
    "t5": Family(t5.T5Config, t5.T5, "encoder_decoder"),
    "bert": Family(bert.BertConfig, bert.BERT, "encoder_only"),
    "roberta": Family(bert.RobertaConfig, bert.BERT, "encoder_only"),
}

__all__ = ["DTYPES", "FAMILIES", "Family", "FamilyConfig", "KINDS", "build_model", "config_from_dict", "family_of"]


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
