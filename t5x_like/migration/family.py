"""What a model family is to the migration (`Family`: one entry of families.py's table) and the readings of shape
settings that every family shares: the layers, width, heads and MLP, dropout, the norm's epsilon, the longest
sequence, and upstream's defaults for what a file leaves unsaid (written out, since ours may differ)."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from t5x_like.errors import UserError
from t5x_like.migration.rows import Row, normalise
from t5x_like.migration.translate import Out, provenance
from t5x_like.migration.upstream import Setting, Upstream

Fields = dict[str, tuple[Any, str]]
"""Model config field -> (value, where it came from)."""

UPSTREAM_DEFAULTS = {
    "megatron": {"hidden_dropout": 0.1, "attention_dropout": 0.1, "init_method_std": 0.02, "layernorm_epsilon": 1e-5,
                 "rotary_base": 10000, "rope_scaling_factor": 8.0, "rotary_percent": 1.0},
    "neox": {"hidden_dropout": 0.0, "attention_dropout": 0.0, "init_method_std": 0.02, "layernorm_epsilon": 1e-5,
             "rotary_pct": 1.0, "rotary_emb_base": 10000, "gpt_j_residual": False, "init_method": "normal",
             "output_layer_init_method": "scaled_normal", "rms_norm_epsilon": 1e-8, "mlp_multiple_of": 1,
             "use_bias_in_attn_linear": True, "use_bias_in_mlp": True, "no_weight_tying": False},
}
"""Upstream defaults (Megatron-LM's arguments.py and TransformerConfig, NeoX's neox_arguments.md) a file leaves
unsaid, keyed by the first name a reading asks for."""


@dataclasses.dataclass(frozen=True)
class Feature:
    """An architecture choice upstream makes with one setting (and maybe a flag that implies a value of it), and
    the value a family builds: a family is picked by how many of its features a file matches, and a feature it
    does not match is listed as not migrated."""

    setting: str  # as upstream spells it: --normalization, norm
    builds: Any  # the value this family builds
    default: Any  # upstream's value when the file does not set it
    description: str  # what the family builds, for the reason: "RMSNorm"
    implied_by: tuple[str, Any] | None = None  # (a flag, the value it sets when given): Megatron's legacy spellings

    def spellings(self) -> tuple[str, ...]:
        return (self.setting,) + ((self.implied_by[0],) if self.implied_by else ())

    def read(self, settings: Mapping[str, Setting]) -> tuple[Any, Setting | None]:
        """The value upstream uses and the setting that gives it (None: upstream's default)."""
        if self.implied_by and (flag := settings.get(normalise(self.implied_by[0]))) is not None and flag.flag():
            return self.implied_by[1], flag
        setting = settings.get(normalise(self.setting))
        if setting is None:
            return self.default, None
        return (setting.flag() if isinstance(self.builds, bool) else setting.value), setting

    def matches(self, settings: Mapping[str, Setting]) -> bool:
        return self.read(settings)[0] == self.builds


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family as a migration target: which upstream runs it takes (`tool`, Megatron `programs`, the
    `signature` settings of a flags file with no program, the architecture `features`), where its shape starts
    (`base_preset`), how upstream's settings become its config fields (`fields`) and sequence lengths
    (`lengths`), and the rows (docs/migrating.md) of the settings these read beyond the shared shape rows."""

    name: str  # a family of models.FAMILIES
    tool: str  # whose settings it reads: "megatron" or "neox"
    base_preset: str
    fields: Callable[[Upstream, Out], Fields]
    lengths: Callable[[Upstream, Out], None]
    programs: tuple[str, ...] = ()  # Megatron programs it trains (a part of the name: "gpt" in pretrain_gpt2.py)
    signature: tuple[str, ...] = ()  # a flags file with no program: settings only this family's runs have
    features: tuple[Feature, ...] = ()
    rows: tuple[Row, ...] = ()

    def claims(self, upstream: Upstream) -> bool:
        program = upstream.program
        return self.tool == upstream.kind and (not program or any(p in program for p in self.programs))

    def fit(self, upstream: Upstream) -> tuple[bool, int]:
        """How well a run fits: its signature settings, then the number of features it matches."""
        settings = upstream.settings
        return (any(k in settings for k in self.signature),
                sum(feature.matches(settings) for feature in self.features))


def field(upstream: Upstream, out: Out, *keys: str, kind: type = float) -> tuple[Any, str]:
    """(value, where it came from) of the first of `keys` the files set, or upstream's default of the first."""
    setting = upstream.get(*keys)
    if setting is not None:
        value = setting.number(kind) if kind in (int, float) else setting.flag() if kind is bool else setting.value
        return value, provenance(setting)
    return UPSTREAM_DEFAULTS[upstream.kind][keys[0]], f"{keys[0]} not set: {out.default()}"


def four_times_hidden(hidden: int, out: Out) -> tuple[int, str]:
    return 4 * hidden, f"4 x hidden size: {out.default()}"


def common_fields(upstream: Upstream, out: Out, mlp_default: Callable[[int, Out], tuple[int, str]] = four_times_hidden
                  ) -> Fields:
    """num_layers, embed_dim, num_heads, mlp_dim (upstream's default when unset), dropout and the norm's epsilon."""
    fields = {}
    for name, key in (("num_layers", "num_layers"), ("embed_dim", "hidden_size"), ("num_heads", "num_attention_heads")):
        setting = upstream.get(key)
        if setting is None:
            raise UserError(f"{upstream.files[0]}: no {key} ({key.replace('_', '-')}): the model's shape is not "
                            "given; add it.")
        fields[name] = (setting.number(int), provenance(setting))
    mlp = upstream.get("ffn_hidden_size", "ff_hidden_size", "intermediate_size")
    fields["mlp_dim"] = (mlp.number(int), provenance(mlp)) if mlp else mlp_default(fields["embed_dim"][0], out)
    fields["dropout_rate"] = field(upstream, out, "hidden_dropout")
    fields["layer_norm_eps"] = field(upstream, out, "layernorm_epsilon", "norm_epsilon")
    return fields


def head_width(upstream: Upstream, out: Out, fields: Fields) -> None:
    """Heads embed_dim / num_heads wide: another --kv-channels has no equivalent."""
    kv = upstream.get("kv_channels", "kv_hidden_size")
    natural = fields["embed_dim"][0] // fields["num_heads"][0]
    if kv is not None and kv.number(int) != natural:
        out.skip(kv, f"heads here are hidden size / heads = {natural} wide")


def max_len(upstream: Upstream, out: Out, fields: Fields) -> None:
    """max_len from the position table's size, else the sequence length; a sequence longer than the table is
    refused, as Megatron-LM refuses it."""
    positions, seq = upstream.get("max_position_embeddings"), upstream.get("seq_length")
    if positions is not None and seq is not None and seq.number(int) > positions.number(int):
        raise UserError(f"{provenance(seq)} is above {provenance(positions)}: Megatron-LM and GPT-NeoX refuse it too (a "
                        "sequence longer than the positions); lower the one or raise the other.")
    if positions is not None:
        fields["max_len"] = (positions.number(int), provenance(positions))
    elif seq is not None:
        fields["max_len"] = (seq.number(int), f"{provenance(seq)}: no --max-position-embeddings")


def decoder_lengths(upstream: Upstream, out: Out) -> None:
    seq = upstream.get("seq_length")
    if seq is None:
        raise UserError(f"{upstream.files[0]}: no seq_length (--seq-length); add it.")
    out.set("SEQ_LEN", seq.number(int), provenance(seq))
