"""The model: its family (families.py's table: the entry whose upstream runs and architecture the files fit best),
its preset (the preset of exactly that shape, else the family's base preset with the shape as
model_config.overrides), sequence lengths, and what the family here builds differently from upstream."""
from __future__ import annotations

import dataclasses
from typing import Any

import configs
import models
from t5x_like.errors import UserError
from t5x_like.migration import moe
from t5x_like.migration.families import FAMILIES
from t5x_like.migration.family import Family
from t5x_like.migration.rows import TOOLS, Row, normalise, translates
from t5x_like.migration.translate import Out
from t5x_like.migration.upstream import Upstream

TRAINING_CHOICES = ("family", "vocab_size", "layer_norm_eps", "init_std")
"""Architecture fields that do not make a preset another shape: the tokenizer's vocabulary, the norm's epsilon and
the initialisation are the run's to choose."""

SHAPE_ROWS = (
    Row(("overrides.num_layers",), "an encoder-decoder: the encoder's and the decoder's depth",
        megatron=("--num-layers",), neox=("num_layers",)),
    Row(("overrides.embed_dim",), megatron=("--hidden-size",), neox=("hidden_size",)),
    Row(("overrides.num_heads",), megatron=("--num-attention-heads",), neox=("num_attention_heads",)),
    Row(("overrides.mlp_dim",), "default 4 x hidden size (Megatron with --swiglu: 8/3 x, down to a multiple of 64)",
        megatron=("--ffn-hidden-size", "--ff-hidden-size"), neox=("intermediate_size",)),
    Row(("overrides.max_len",), "the longest sequence (where positions are learned, the position table's rows)",
        megatron=("--max-position-embeddings",), neox=("max_position_embeddings",)),
    Row(("SEQ_LEN",), megatron=("--seq-length",), neox=("seq_length",)),
    Row(("overrides.dropout_rate",), megatron=("--hidden-dropout",), neox=("hidden_dropout",)),
    Row(("overrides.attention_dropout_rate",), "a rate > 0 makes ATTENTION='auto' use XLA attention (the fused "
        "kernels have no dropout)", megatron=("--attention-dropout",), neox=("attention_dropout",)),
    Row(("overrides.init_std",), megatron=("--init-method-std",), neox=("init_method_std",)),
    Row(("overrides.layer_norm_eps",), megatron=("--layernorm-epsilon", "--norm-epsilon"),
        neox=("layernorm_epsilon",)),
    Row((), "the vocabulary (the tokenizer's) is padded to a multiple of 128 x TENSOR_PARALLEL by itself",
        megatron=("--make-vocab-size-divisible-by", "--padded-vocab-size"), neox=("make_vocab_size_divisible_by",)),
)


def feature_rows() -> tuple[Row, ...]:
    """Per tool, one row of the settings that choose the family, saying what each family builds."""
    found = []
    for tool in TOOLS:
        families = [f for f in FAMILIES if f.tool == tool and f.features]
        if families:
            names = dict.fromkeys(name for f in families for feature in f.features for name in feature.spellings())
            builds = "; ".join(f"{f.name}: {', '.join(feature.description for feature in f.features)}"
                               for f in families)
            note = f"the family whose architecture they describe ({builds}); another choice is listed as not migrated"
            found.append(Row(("model_config.preset",), note, **{tool: tuple(names)}))
    return tuple(found)


def family_of(upstream: Upstream) -> Family:
    claiming = [family for family in FAMILIES if family.claims(upstream)]
    if not claiming:
        programs = " and ".join(dict.fromkeys(f"pretrain_{p}*.py" for f in FAMILIES for p in f.programs))
        raise UserError(f"{upstream.program}: only Megatron's {programs} programs migrate; train BERT from a run "
                        "file such as bert_base.gin.")
    dense = max(claiming, key=lambda family: family.fit(upstream))  # the first of equals
    return moe.with_experts(upstream, dense)


@translates(*SHAPE_ROWS, *feature_rows(), *(row for family in FAMILIES + moe.FAMILIES for row in family.rows))
def model(upstream: Upstream, out: Out) -> None:
    out.section = "model"
    family = family_of(upstream)
    if family.name != moe.MIXTRAL.name:
        moe.skip_dense(upstream, out, next(f for f in moe.FAMILIES if f.tool == upstream.kind).rows)
    fields = family.fields(upstream, out)
    family = moe.exportable_family(family, fields, out)
    differences(upstream, out, family)
    values = {k: v for k, (v, _) in fields.items()}
    preset = nearest_preset(family, values)
    preset_values = preset_fields(preset)
    shape = "upstream's shape is this preset's" if same_shape(preset_values, values) else "its shape is set below"
    out.set("model_config.preset", preset, f"the {family.name} family; {shape}")
    family.lengths(upstream, out)
    for name, (value, why) in fields.items():
        if preset_values.get(name) != value:
            out.override(name, value, why)
    for key in ("make_vocab_size_divisible_by", "padded_vocab_size"):
        out.skip(upstream.get(key), "the vocabulary is padded to a multiple of 128 x TENSOR_PARALLEL here")


def differences(upstream: Upstream, out: Out, family: Family) -> None:
    """Each architecture choice of upstream's that the family does not build, listed as not migrated."""
    for feature in family.features:
        for name in feature.spellings():
            upstream.get(normalise(name))  # read, so never listed as not recognised
        value, setting = feature.read(upstream.settings)
        if value != feature.builds:
            reason = f"the {family.name} family has {feature.description}; this model differs from upstream's here"
            if setting is not None:
                out.skip(setting, reason)
            else:
                out.skipped.append((f"{feature.setting} not set: {out.default()}", reason))


def preset_fields(preset: str) -> dict[str, Any]:
    """Every field of a preset's config, its family's defaults included."""
    return dataclasses.asdict(models.config_from_dict(configs.get_model_config(preset).to_dict()))


def same_shape(preset_values: dict[str, Any], values: dict[str, Any]) -> bool:
    config = models.config_from_dict(preset_values)
    shape = set(config.architecture()) - set(TRAINING_CHOICES)
    return all(preset_values.get(k) == v for k, v in values.items() if k in shape)


def nearest_preset(family: Family, values: dict[str, Any]) -> str:
    """The family's preset of exactly this shape, else its base preset (the shape then goes in the overrides)."""
    for name in configs.PRESETS:
        if configs.get_model_config(name).family == family.name and same_shape(preset_fields(name), values):
            return name
    return family.base_preset
