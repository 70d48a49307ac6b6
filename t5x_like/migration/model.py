"""The model: its family (Megatron's pretrain_gpt*.py -> gpt2, pretrain_t5.py -> t5, a NeoX config -> neox),
its shape as model_config.overrides over the nearest preset (a preset of exactly that shape is included as its
model file), sequence lengths, and what the family here builds differently from upstream."""
from __future__ import annotations

from typing import Any

import configs
from t5x_like.errors import UserError
from t5x_like.migration.rows import Row, translates
from t5x_like.migration.translate import Out, provenance
from t5x_like.migration.upstream import MEGATRON, Upstream

BASE_PRESET = {"gpt2": "gpt2_small", "neox": "pythia_160m", "t5": "t5_small"}
SHAPE = ("num_layers", "num_decoder_layers", "num_heads", "embed_dim", "d_kv", "mlp_dim", "max_len", "rotary_pct",
         "use_parallel_residual", "feed_forward", "tie_word_embeddings")
"""Fields that make a preset the same architecture (the others are training choices: dropout, init, eps)."""
UPSTREAM_DEFAULTS = {
    "megatron": {"hidden_dropout": 0.1, "attention_dropout": 0.1, "init_method_std": 0.02, "layernorm_epsilon": 1e-5},
    "neox": {"hidden_dropout": 0.0, "attention_dropout": 0.0, "init_method_std": 0.02, "layernorm_epsilon": 1e-5,
             "rotary_pct": 1.0, "rotary_emb_base": 10000, "gpt_j_residual": False, "pos_emb": "learned",
             "norm": "layernorm", "activation": "gelu", "no_weight_tying": False, "init_method": "normal"},
}
"""Upstream defaults (Megatron-LM's arguments.py, NeoX's neox_arguments.md) a file leaves unsaid; written out,
since ours may differ."""

SHAPE_ROWS = (
    Row(("overrides.num_layers",), "T5: the encoder's and the decoder's depth (`num_decoder_layers`)",
        megatron=("--num-layers",), neox=("num_layers",)),
    Row(("overrides.embed_dim",), megatron=("--hidden-size",), neox=("hidden_size",)),
    Row(("overrides.num_heads",), megatron=("--num-attention-heads",), neox=("num_attention_heads",)),
    Row(("overrides.mlp_dim",), "default 4 x hidden size", megatron=("--ffn-hidden-size", "--ff-hidden-size"),
        neox=("intermediate_size",)),
    Row(("overrides.d_kv",), "T5 only; GPT-2 and NeoX heads are hidden / heads wide (another width is listed as not "
        "migrated)", megatron=("--kv-channels", "--kv-hidden-size")),
    Row(("overrides.max_len",), "T5 has relative position buckets and no position table",
        megatron=("--max-position-embeddings",), neox=("max_position_embeddings",)),
    Row(("SEQ_LEN", "FEATURE_LENGTHS"), "encoder-decoder: `FEATURE_LENGTHS = {'inputs': enc, 'targets': dec}`",
        megatron=("--seq-length", "--encoder-seq-length", "--enc-seq-length", "--decoder-seq-length",
                  "--dec-seq-length"), neox=("seq_length",)),
    Row(("overrides.dropout_rate",), megatron=("--hidden-dropout",), neox=("hidden_dropout",)),
    Row(("overrides.attention_dropout_rate",), "a rate > 0 makes ATTENTION='auto' use XLA attention (the fused "
        "kernels have no dropout)", megatron=("--attention-dropout",), neox=("attention_dropout",)),
    Row(("overrides.init_std",), "NeoX: `init_method` 'normal' uses it; 'small_init' is the neox family's own",
        megatron=("--init-method-std",), neox=("init_method_std", "init_method", "output_layer_init_method")),
    Row(("overrides.layer_norm_eps",), megatron=("--layernorm-epsilon",), neox=("layernorm_epsilon",)),
    Row(("overrides.rotary_pct", "overrides.rotary_base"), neox=("rotary_pct", "rotary_emb_base")),
    Row(("overrides.use_parallel_residual",), neox=("gpt_j_residual",)),
    Row((), "the neox family has rotary embeddings, LayerNorm, GELU and an untied output layer; other choices are "
        "listed as not migrated", neox=("pos_emb", "norm", "activation", "no_weight_tying")),
    Row((), "the vocabulary (the tokenizer's) is padded to a multiple of 128 x TENSOR_PARALLEL by itself",
        megatron=("--make-vocab-size-divisible-by",), neox=("make_vocab_size_divisible_by",)),
)


def family_of(upstream: Upstream) -> str:
    if upstream.kind != MEGATRON:
        return "neox"
    program = upstream.program or ""
    if "t5" in program or (not program and {"enc_seq_length", "encoder_seq_length"} & set(upstream.settings)):
        return "t5"
    if program and "gpt" not in program:
        raise UserError(f"{program}: only Megatron's GPT (pretrain_gpt*.py) and T5 (pretrain_t5.py) programs "
                        "migrate; train BERT from a run file such as bert_base.gin.")
    return "gpt2"


@translates(*SHAPE_ROWS)
def model(upstream: Upstream, out: Out) -> None:
    out.section = "model"
    family = family_of(upstream)
    fields = {"gpt2": gpt2_fields, "neox": neox_fields, "t5": t5_fields}[family](upstream, out)
    lengths(upstream, out, family)
    preset = nearest_preset(family, {k: v for k, (v, _) in fields.items()})
    values = dict(configs.get_model_config(preset).to_dict())
    out.model_file = f"models/{preset}.gin" if all(values.get(k) == v for k, (v, _) in fields.items()
                                                   if k in SHAPE) else None
    if out.model_file is None:
        out.set("model_config.preset", preset, f"the {family} family; its shape is set below")
    for field, (value, why) in fields.items():
        if values.get(field) != value:
            out.override(field, value, why)
    divisible = upstream.get("make_vocab_size_divisible_by")
    out.skip(divisible, "the vocabulary is padded to a multiple of 128 x TENSOR_PARALLEL here")


def field(upstream: Upstream, out: Out, key: str, kind: type = float) -> tuple[Any, str]:
    """(value, where it came from) of a setting, or its upstream default."""
    setting = upstream.get(key)
    if setting is not None:
        value = setting.number(kind) if kind in (int, float) else setting.flag() if kind is bool else setting.value
        return value, provenance(setting)
    return UPSTREAM_DEFAULTS[upstream.kind][key], f"{key} not set: {out.default()}"


def common_fields(upstream: Upstream, out: Out) -> dict[str, tuple[Any, str]]:
    """num_layers, embed_dim, num_heads, mlp_dim (4 x hidden when unset), dropout and layer-norm epsilon."""
    fields = {}
    for name, key in (("num_layers", "num_layers"), ("embed_dim", "hidden_size"), ("num_heads", "num_attention_heads")):
        setting = upstream.get(key)
        if setting is None:
            raise UserError(f"{upstream.files[0]}: no {key} ({key.replace('_', '-')}): the model's shape is not "
                            "given; add it.")
        fields[name] = (setting.number(int), provenance(setting))
    mlp = upstream.get("ffn_hidden_size", "ff_hidden_size", "intermediate_size")
    hidden = fields["embed_dim"][0]
    fields["mlp_dim"] = (mlp.number(int), provenance(mlp)) if mlp else (4 * hidden, f"4 x hidden size: {out.default()}")
    fields["dropout_rate"] = field(upstream, out, "hidden_dropout")
    fields["layer_norm_eps"] = field(upstream, out, "layernorm_epsilon")
    return fields


def head_width(upstream: Upstream, out: Out, fields: dict) -> None:
    """GPT-2 and NeoX heads are embed_dim / num_heads wide; another --kv-channels has no equivalent."""
    kv = upstream.get("kv_channels", "kv_hidden_size")
    natural = fields["embed_dim"][0] // fields["num_heads"][0]
    if kv is not None and kv.number(int) != natural:
        out.skip(kv, f"heads here are hidden size / heads = {natural} wide")


def max_len(upstream: Upstream, out: Out, fields: dict) -> None:
    positions = upstream.get("max_position_embeddings")
    if positions is not None:
        fields["max_len"] = (positions.number(int), provenance(positions))
    else:
        seq = upstream.get("seq_length")
        if seq is not None:
            fields["max_len"] = (seq.number(int), f"{provenance(seq)}: no --max-position-embeddings")


def gpt2_fields(upstream: Upstream, out: Out) -> dict[str, tuple[Any, str]]:
    fields = common_fields(upstream, out)
    head_width(upstream, out, fields)
    max_len(upstream, out, fields)
    fields["attention_dropout_rate"] = field(upstream, out, "attention_dropout")
    fields["init_std"] = field(upstream, out, "init_method_std")
    return fields


def neox_fields(upstream: Upstream, out: Out) -> dict[str, tuple[Any, str]]:
    fields = common_fields(upstream, out)
    max_len(upstream, out, fields)
    fields["attention_dropout_rate"] = field(upstream, out, "attention_dropout")
    fields["rotary_pct"] = field(upstream, out, "rotary_pct")
    base, why = field(upstream, out, "rotary_emb_base")
    fields["rotary_base"] = (float(base), why)
    fields["use_parallel_residual"] = field(upstream, out, "gpt_j_residual", bool)
    init, why = field(upstream, out, "init_method", str)
    if init == "normal":
        fields["init_std"] = field(upstream, out, "init_method_std")
    elif init != "small_init":
        out.skip(upstream.get("init_method"), "the neox family initialises inputs with small_init (or 'normal')")
    if field(upstream, out, "output_layer_init_method", str)[0] != "wang_init":
        out.skip(upstream.get("output_layer_init_method"), "the neox family initialises output layers with wang_init")
    for key, wanted, reason in (("pos_emb", "rotary", "rotary embeddings"), ("norm", "layernorm", "LayerNorm"),
                                ("activation", "gelu", "a GELU MLP"),
                                ("no_weight_tying", True, "an untied output layer")):
        value, why = field(upstream, out, key, bool if key == "no_weight_tying" else str)
        if value != wanted:
            reason = f"the neox family has {reason}; this model differs from upstream's here"
            out.skip(upstream.get(key), reason) if upstream.get(key) else out.skipped.append((why, reason))
    return fields


def t5_fields(upstream: Upstream, out: Out) -> dict[str, tuple[Any, str]]:
    """CPM-Pretrain's pretrain_t5.py: a Megatron encoder-decoder (learned absolute positions, LayerNorm, GELU MLP,
    tied embeddings) as the t5 family's nearest: relative position buckets, RMS norm, a ReLU MLP of that width."""
    fields = common_fields(upstream, out)
    fields["num_decoder_layers"] = (fields["num_layers"][0], f"{fields['num_layers'][1]}: the decoder's depth too")
    kv = upstream.get("kv_channels", "kv_hidden_size")
    natural = fields["embed_dim"][0] // fields["num_heads"][0]
    fields["d_kv"] = (kv.number(int), provenance(kv)) if kv else (natural, "hidden size / heads")
    fields["tie_word_embeddings"] = (True, "Megatron's encoder-decoder ties its input and output embeddings")
    fields["feed_forward"] = ("relu", ("an ungated MLP of that width (upstream's is GELU; the t5 family has relu "
                                       "or gated-gelu)"))
    fields["layer_norm_eps"] = (fields["layer_norm_eps"][0], fields["layer_norm_eps"][1] + " (an RMS norm here)")
    attention = upstream.get("attention_dropout")
    if attention is not None and attention.number() != fields["dropout_rate"][0]:
        out.skip(attention, "the t5 family has one dropout_rate, set from --hidden-dropout")
    out.skip(upstream.get("max_position_embeddings"), "the t5 family has relative position buckets, no position "
             "table (upstream learns absolute positions)")
    return fields


def lengths(upstream: Upstream, out: Out, family: str) -> None:
    if family == "t5":
        inputs = upstream.get("encoder_seq_length", "enc_seq_length")
        targets = upstream.get("decoder_seq_length", "dec_seq_length")
        if inputs is None or targets is None:
            raise UserError(f"{upstream.files[0]}: an encoder-decoder needs --enc-seq-length and --dec-seq-length.")
        out.set("SEQ_LEN", None, "encoder-decoder: FEATURE_LENGTHS below")
        out.set("FEATURE_LENGTHS", {"inputs": inputs.number(int), "targets": targets.number(int)},
                f"{provenance(inputs)}, {provenance(targets)}")
        out.set("OBJECTIVE", "span_corruption", "T5 pre-training (CPM-Pretrain's T5 dataset masks spans)")
        return
    seq = upstream.get("seq_length")
    if seq is None:
        raise UserError(f"{upstream.files[0]}: no seq_length (--seq-length); add it.")
    out.set("SEQ_LEN", seq.number(int), provenance(seq))


def nearest_preset(family: str, fields: dict[str, Any]) -> str:
    """The family's preset of exactly this shape, else its base preset (the shape then goes in the overrides)."""
    names = [n for n in configs.PRESETS if configs.get_model_config(n).family == family]
    for name in names:
        values = configs.get_model_config(name).to_dict()
        if all(values.get(k) == v for k, v in fields.items() if k in SHAPE):
            return name
    return BASE_PRESET[family]
