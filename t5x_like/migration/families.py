"""The model families a migration targets, one table entry each (`FAMILIES`): which upstream runs each takes, its
base preset, how upstream's settings become its config fields, and the rows of the settings it reads. Megatron's
GPT programs become the family whose architecture their flags describe (GPT-2's learned positions, LayerNorm and
GELU MLP, or Llama's rotary embeddings, RMSNorm and SwiGLU MLP), pretrain_t5.py the t5 family, and NeoX configs
the neox family, or the llama family where they describe RMSNorm and a SwiGLU MLP (NeoX's configs/llama*/)."""
from __future__ import annotations

import re

from t5x_like.errors import UserError
from t5x_like.migration.cpm2 import CPM2
from t5x_like.migration.family import (Family, Feature, Fields, common_fields, decoder_lengths, field, head_width,
                                       max_len)
from t5x_like.migration.rows import Row
from t5x_like.migration.translate import Out, provenance
from t5x_like.migration.upstream import Upstream

ROPE = ("--use-rotary-position-embeddings", "rope")


def gpt2_fields(upstream: Upstream, out: Out) -> Fields:
    fields = common_fields(upstream, out)
    head_width(upstream, out, fields)
    max_len(upstream, out, fields)
    fields["attention_dropout_rate"] = field(upstream, out, "attention_dropout")
    fields["init_std"] = field(upstream, out, "init_method_std")
    return fields


GPT2 = Family("gpt2", "megatron", "gpt2_small", gpt2_fields, decoder_lengths, programs=("gpt",), features=(
    Feature("--position-embedding-type", "learned_absolute", "learned_absolute", "learned positions", ROPE),
    Feature("--normalization", "LayerNorm", "LayerNorm", "LayerNorm"),
    Feature("--swiglu", False, False, "a GELU MLP"),
    Feature("--untie-embeddings-and-output-weights", False, False, "an output layer tied to the input embedding")))


def t5_fields(upstream: Upstream, out: Out) -> Fields:
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


def t5_lengths(upstream: Upstream, out: Out) -> None:
    inputs = upstream.get("encoder_seq_length", "enc_seq_length")
    targets = upstream.get("decoder_seq_length", "dec_seq_length")
    if inputs is None or targets is None:
        raise UserError(f"{upstream.files[0]}: an encoder-decoder needs --enc-seq-length and --dec-seq-length.")
    out.set("SEQ_LEN", None, "encoder-decoder: FEATURE_LENGTHS below")
    out.set("FEATURE_LENGTHS", {"inputs": inputs.number(int), "targets": targets.number(int)},
            f"{provenance(inputs)}, {provenance(targets)}")
    out.set("OBJECTIVE", "span_corruption", "T5 pre-training (CPM-Pretrain's T5 dataset masks spans)")


T5 = Family("t5", "megatron", "t5_small", t5_fields, t5_lengths, programs=("t5",),
            signature=("enc_seq_length", "encoder_seq_length"), rows=(
                Row(("overrides.d_kv",), "the t5 family's head width; the other families' heads are hidden / heads "
                    "wide (another width is listed as not migrated)", megatron=("--kv-channels", "--kv-hidden-size")),
                Row(("FEATURE_LENGTHS",), "`{'inputs': enc, 'targets': dec}`",
                    megatron=("--encoder-seq-length", "--enc-seq-length", "--decoder-seq-length",
                              "--dec-seq-length"))))


def swiglu_width(hidden: int, out: Out) -> tuple[int, str]:
    width = int(4 * hidden * 2 / 3 / 64) * 64
    return width, f"8/3 x hidden size, down to a multiple of 64: {out.default()} with --swiglu"


def key_value_heads(upstream: Upstream, out: Out, heads: int) -> tuple[int | None, str]:
    """Megatron reads --num-query-groups only with --group-query-attention (whose own default is 1)."""
    gqa, groups = upstream.get("group_query_attention"), upstream.get("num_query_groups")
    if gqa is None or not gqa.flag():
        out.skip(groups, "Megatron reads it only with --group-query-attention: a key/value head per query head")
        return None, "no --group-query-attention: a key/value head per query head"
    count = 1 if groups is None else groups.number(int)
    why = provenance(groups, f"{provenance(gqa)} without --num-query-groups: 1, {out.default()}")
    return (None, f"{why}: as many as the query heads") if count == heads else (count, why)


def rotary(upstream: Upstream, out: Out) -> Fields:
    """rope_theta, Llama 3.1's frequency scaling (Megatron fixes its low / high factors and original length at
    Llama 3.1's, as this config's defaults), and the rotary choices the llama family does not have."""
    base, why = field(upstream, out, "rotary_base")
    fields = {"rope_theta": (float(base), why), "rope_scaling_factor": (None, "no --use-rope-scaling")}
    scaling, factor = upstream.get("use_rope_scaling"), upstream.get("rope_scaling_factor")
    if scaling is not None and scaling.flag():
        value, why = field(upstream, out, "rope_scaling_factor")
        fixed = f"{provenance(scaling)}: Megatron's fixed value"
        fields.update(rope_scaling_factor=(float(value), why), rope_low_freq_factor=(1.0, fixed),
                      rope_high_freq_factor=(4.0, fixed), rope_original_max_len=(8192, fixed))
    else:
        out.skip(factor, "Megatron reads it only with --use-rope-scaling: no scaling")
    if field(upstream, out, "rotary_percent")[0] != 1.0:
        out.skip(upstream.get("rotary_percent"), "the llama family rotates whole heads")
    for key, reason in (("rotary_interleaved", "the llama family rotates the two halves of each head (Megatron's "
                         "default), not interleaved pairs"),
                        ("rotary_seq_len_interpolation_factor", "linear position interpolation has no equivalent"),
                        ("qk_layernorm", "the llama family has no query / key norm; this model differs from "
                         "upstream's here"),
                        ("apply_layernorm_1p", "the norm's scale is stored as it is here (Megatron stores scale - 1 "
                         "with this flag): the same function, starting at 1 and not weight-decayed in both")):
        setting = upstream.get(key)
        out.skip(setting if setting is not None and setting.flag() else None, reason)
    upstream.get("no_position_embedding")  # rotary embeddings: no position table with or without it
    return fields


def biases(upstream: Upstream, out: Out) -> tuple[bool, str]:
    """Megatron puts biases on every linear layer unless --disable-bias-linear; --add-qkv-bias keeps q/k/v's."""
    disabled, qkv = upstream.get("disable_bias_linear"), upstream.get("add_qkv_bias")
    if disabled is None or not disabled.flag():
        why = f"--disable-bias-linear not set: {out.default()}"
        out.skipped.append((why, "Megatron adds biases to every linear layer; the llama family has them on query, "
                                 "key and value only: this model differs from upstream's here"))
        return True, f"{why}: biases on every linear layer"
    if qkv is not None and qkv.flag():
        return True, provenance(qkv)
    return False, f"{provenance(disabled)}, no --add-qkv-bias"


def sliding_window(upstream: Upstream, out: Out) -> tuple[int | None, str]:
    """Megatron's --window-size L,R (keys i-L..i+R, Transformer Engine's convention; -1: unbounded)."""
    size = upstream.get("window_size")
    if size is None:
        out.skip(upstream.get("window_attn_skip_freq"), "no --window-size: every layer attends to all before it")
        return None, "no --window-size"
    numbers = re.fullmatch(r"\(?\s*(-?\d+)\s*,\s*(-?\d+)\s*\)?", str(size.value))
    if numbers is None:
        raise UserError(f"{size.where}: --window-size {size.value!r} is not two whole numbers LEFT,RIGHT; fix the "
                        "value (Mistral's 4096-token window: 4095,0).")
    left, right = int(numbers[1]), int(numbers[2])
    out.skip(upstream.get("window_attn_skip_freq"), "every layer has the window here")
    if right != 0:
        out.skip(size, "the window here is causal (keys after the query have no equivalent)")
    if left < 0:
        return None, f"{provenance(size)}: unbounded to the left"
    return left + 1, f"{provenance(size)}: keys i-{left}..i, {left + 1} tokens with the query's own"


def llama_fields(upstream: Upstream, out: Out) -> Fields:
    """Megatron-Core's GPT model with Llama's choices: grouped-query attention, rotary embeddings (Llama 3.1's
    scaling), biases, tied or untied output layer, sliding window."""
    fields = common_fields(upstream, out, swiglu_width)
    head_width(upstream, out, fields)
    max_len(upstream, out, fields)
    fields["attention_dropout_rate"] = field(upstream, out, "attention_dropout")
    fields["init_std"] = field(upstream, out, "init_method_std")
    fields["num_key_value_heads"] = key_value_heads(upstream, out, fields["num_heads"][0])
    fields.update(rotary(upstream, out))
    fields["qkv_bias"] = biases(upstream, out)
    untie = upstream.get("untie_embeddings_and_output_weights")
    fields["tie_word_embeddings"] = (False, provenance(untie)) if untie is not None and untie.flag() else (
        True, "no --untie-embeddings-and-output-weights: Megatron's output layer is the input embedding")
    fields["sliding_window"] = sliding_window(upstream, out)
    return fields


LLAMA = Family("llama", "megatron", "llama2_7b", llama_fields, decoder_lengths, programs=("gpt",), features=(
    Feature("--position-embedding-type", "rope", "learned_absolute", "rotary embeddings", ROPE),
    Feature("--normalization", "RMSNorm", "LayerNorm", "RMSNorm"),
    Feature("--swiglu", True, False, "a SwiGLU MLP")), rows=(
    Row(("overrides.num_key_value_heads",), "grouped-query attention; Megatron reads --num-query-groups only with "
        "--group-query-attention (and then defaults to 1)", megatron=("--group-query-attention", "--num-query-groups")),
    Row(("overrides.rope_theta",), "Megatron's default is 10000", megatron=("--rotary-base",)),
    Row(("overrides.rope_scaling_factor",), "Llama 3.1's scaled frequencies (low / high frequency factors 1 / 4 and "
        "original length 8192 in both)", megatron=("--use-rope-scaling", "--rope-scaling-factor")),
    Row(("overrides.tie_word_embeddings",), "unset, Megatron ties the output layer to the input embedding, and so "
        "does the migrated model (Llama 2 and 3 have their own; Qwen2's small sizes tie)",
        megatron=("--untie-embeddings-and-output-weights",)),
    Row(("overrides.qkv_bias",), "the llama family has biases on query, key and value only (Qwen2's "
        "--add-qkv-bias); without --disable-bias-linear Megatron has them on every linear layer (listed as not "
        "migrated)", megatron=("--disable-bias-linear", "--add-qkv-bias")),
    Row(("overrides.sliding_window",), "`--window-size L,0` (keys i-L..i) is a window of L + 1 tokens; a window on "
        "some layers only has no equivalent", megatron=("--window-size", "--window-attn-skip-freq")),
    Row((), "the llama family rotates the halves of whole heads, with no interpolation; it has no query / key norm; "
        "its norm scale is stored as it is (the same function as --apply-layernorm-1p's scale - 1); rotary "
        "embeddings need no --no-position-embedding", megatron=(
            "--rotary-percent", "--rotary-interleaved", "--rotary-seq-len-interpolation-factor", "--qk-layernorm",
            "--apply-layernorm-1p", "--no-position-embedding"))))


def neox_fields(upstream: Upstream, out: Out) -> Fields:
    fields = common_fields(upstream, out)
    max_len(upstream, out, fields)
    fields["attention_dropout_rate"] = field(upstream, out, "attention_dropout")
    fields["rotary_pct"] = field(upstream, out, "rotary_pct")
    base, why = field(upstream, out, "rotary_emb_base")
    fields["rotary_base"] = (float(base), why)
    fields["use_parallel_residual"] = field(upstream, out, "gpt_j_residual", kind=bool)
    init, why = field(upstream, out, "init_method", kind=str)
    if init == "normal":
        fields["init_std"] = field(upstream, out, "init_method_std")
    elif init != "small_init":
        out.skip(upstream.get("init_method"), "the neox family initialises inputs with small_init (or 'normal')")
    output, why = field(upstream, out, "output_layer_init_method", kind=str)
    if output != "wang_init":
        reason, setting = "the neox family initialises output layers with wang_init", upstream.get(
            "output_layer_init_method")
        out.skip(setting, reason) if setting is not None else out.skipped.append((why, reason))
    return fields


NEOX = Family("neox", "neox", "pythia_160m", neox_fields, decoder_lengths, features=(
    Feature("pos_emb", "rotary", "learned", "rotary embeddings"),
    Feature("norm", "layernorm", "layernorm", "LayerNorm"),
    Feature("activation", "gelu", "gelu", "a GELU MLP"),
    Feature("no_weight_tying", True, False, "an untied output layer")), rows=(
    Row(("overrides.rotary_pct", "overrides.rotary_base"), neox=("rotary_pct", "rotary_emb_base")),
    Row(("overrides.use_parallel_residual",), neox=("gpt_j_residual",)),
    Row(("overrides.init_std",), "`init_method` 'normal' uses init_method_std; 'small_init' and the output layers' "
        "'wang_init' are the neox family's own", neox=("init_method", "output_layer_init_method"))))


def llama_parallel_mlp(settings) -> bool:
    """NeoX's LLaMAParallelMLP (2023-24): `mlp_type: llama` without `activation: swiglu` (which ParallelMLP reads
    since September 2024, whatever mlp_type says)."""
    mlp_type, activation = settings.get("mlp_type"), settings.get("activation")
    return mlp_type is not None and mlp_type.value == "llama" and (activation is None or activation.value != "swiglu")


class NeoxGatedMLP(Feature):
    """GPT-NeoX's SwiGLU MLP: `activation: swiglu` (its ParallelMLP since 2024), or `mlp_type: llama` with
    `activation: silu` (its LLaMAParallelMLP of 2023-24, which gated the activation it was given)."""

    def spellings(self) -> tuple[str, ...]:
        return ("activation", "mlp_type")

    def read(self, settings):
        if not llama_parallel_mlp(settings):
            return super().read(settings)
        activation = settings.get("activation")
        value = self.default if activation is None else activation.value
        return ("swiglu" if value == "silu" else f"gated {value}"), activation or settings.get("mlp_type")


def round_up(value: int, multiple: int) -> int:
    return multiple * -(-value // multiple)


def neox_gated_width(upstream: Upstream, out: Out, hidden: int) -> tuple[int, str]:
    """Each of the two input projections' width, as GPT-NeoX computes it. ParallelMLP (`activation: swiglu`)
    takes 2/3 of intermediate_size (else expansion_factor x, else 4 x hidden size) for both halves together, each
    half up to a multiple of mlp_multiple_of (Llama 2 7B: 32768 -> 11008); LLaMAParallelMLP (`mlp_type: llama`)
    took intermediate_size as each half's width, else 8/3 x hidden size up to a multiple of 256."""
    size, mlp_type = upstream.get("intermediate_size"), upstream.get("mlp_type")
    if llama_parallel_mlp(upstream.settings):
        out.skip(upstream.get("mlp_multiple_of"), "LLaMAParallelMLP (mlp_type: llama) rounds to 256 whatever this "
                                                  "says")
        if size is not None:
            return size.number(int), f"{provenance(size)}: each half's width with {provenance(mlp_type)}"
        return round_up(int(8 * hidden / 3), 256), f"{provenance(mlp_type)}: 8/3 x hidden size, up to a multiple " \
                                                   "of 256"
    factor = upstream.get("expansion_factor")
    if size is not None:
        total, why = size.number(int), provenance(size)
    elif factor is not None:
        total, why = int(factor.number(float) * hidden), f"{provenance(factor)} x hidden size"
    else:
        total, why = 4 * hidden, f"no intermediate_size: 4 x hidden size, {out.default()}"
    multiple, _ = field(upstream, out, "mlp_multiple_of", kind=int)
    width = round_up(int(total * 2 / 3) // 2, multiple)
    return width, f"{why}: GPT-NeoX's gated MLP is 2/3 of it in two halves, each up to a multiple of {multiple}"


def neox_llama_init(upstream: Upstream, out: Out) -> tuple[float, str]:
    init, why = field(upstream, out, "init_method", kind=str)
    if init != "normal":
        out.skip(upstream.get("init_method"), "the llama family initialises every weight with normal(init_std)")
    output, why = field(upstream, out, "output_layer_init_method", kind=str)
    if output != "normal":
        reason = "the llama family initialises output layers with normal(init_std) too"
        setting = upstream.get("output_layer_init_method")
        out.skip(setting, reason) if setting is not None else out.skipped.append((why, reason))
    return field(upstream, out, "init_method_std")


def neox_llama_fields(upstream: Upstream, out: Out) -> Fields:
    """GPT-NeoX's Llama configs (its configs/llama*/): RMSNorm, a SwiGLU MLP, rotary embeddings, grouped-query
    attention (num_kv_heads), biases on the attention's layers or on none, an untied output layer."""
    fields = common_fields(upstream, out)
    fields["mlp_dim"] = neox_gated_width(upstream, out, fields["embed_dim"][0])
    out.skip(upstream.get("layernorm_epsilon"), "GPT-NeoX's RMSNorm reads rms_norm_epsilon")
    fields["layer_norm_eps"] = field(upstream, out, "rms_norm_epsilon")
    max_len(upstream, out, fields)
    fields["attention_dropout_rate"] = field(upstream, out, "attention_dropout")
    fields["init_std"] = neox_llama_init(upstream, out)
    kv = upstream.get("num_kv_heads")
    heads = fields["num_heads"][0]
    fields["num_key_value_heads"] = (None, "no num_kv_heads: a key/value head per query head") if kv is None else (
        None if kv.number(int) == heads else kv.number(int), provenance(kv))
    base, why = field(upstream, out, "rotary_emb_base")
    fields["rope_theta"] = (float(base), why)
    if field(upstream, out, "rotary_pct")[0] != 1.0:
        out.skip(upstream.get("rotary_pct"), "the llama family rotates whole heads")
    fields["qkv_bias"] = field(upstream, out, "use_bias_in_attn_linear", kind=bool)
    if fields["qkv_bias"][0]:
        out.skipped.append((fields["qkv_bias"][1], "GPT-NeoX puts a bias on the attention's output layer too; the "
                                                   "llama family has them on query, key and value only: this model "
                                                   "differs from upstream's here"))
    mlp_bias, why = field(upstream, out, "use_bias_in_mlp", kind=bool)
    if mlp_bias and not llama_parallel_mlp(upstream.settings):  # LLaMAParallelMLP had none
        out.skipped.append((why, "the llama family's MLP has no biases; this model differs from upstream's here"))
    upstream.get("use_bias_in_norms")  # GPT-NeoX's RMSNorm has no bias whatever this says
    untied, why = field(upstream, out, "no_weight_tying", kind=bool)
    fields["tie_word_embeddings"] = (not untied, why)
    if field(upstream, out, "gpt_j_residual", kind=bool)[0]:
        out.skip(upstream.get("gpt_j_residual"), "the llama family adds attention and MLP one after the other")
    return fields


NEOX_LLAMA = Family("llama", "neox", "llama2_7b", neox_llama_fields, decoder_lengths, features=(
    Feature("pos_emb", "rotary", "learned", "rotary embeddings"),
    Feature("norm", "rmsnorm", "layernorm", "RMSNorm"),
    NeoxGatedMLP("activation", "swiglu", "gelu", "a SwiGLU MLP")), rows=(
    Row(("overrides.mlp_dim",), "with `activation: swiglu`, 2/3 of intermediate_size (or expansion_factor x, or 4 x "
        "hidden size) in two halves, each up to a multiple of mlp_multiple_of (Llama 2 7B's 32768: 11008); with "
        "`mlp_type: llama` (2023-24), intermediate_size is each half's width, default 8/3 x hidden size up to a "
        "multiple of 256", neox=("intermediate_size", "expansion_factor", "mlp_multiple_of")),
    Row(("overrides.layer_norm_eps",), "RMSNorm's epsilon (GPT-NeoX's default 1e-8)", neox=("rms_norm_epsilon",)),
    Row(("overrides.num_key_value_heads",), "grouped-query attention; unset, a key/value head per query head",
        neox=("num_kv_heads",)),
    Row(("overrides.rope_theta",), "the llama family's rotary base (GPT-NeoX's default 10000)",
        neox=("rotary_emb_base",)),
    Row(("overrides.qkv_bias",), "GPT-NeoX's default puts biases on the query, key, value and output layers: the "
        "llama family has them on the first three only (listed as not migrated)", neox=("use_bias_in_attn_linear",)),
    Row(("overrides.tie_word_embeddings",), "the llama family's output layer; GPT-NeoX ties it by default",
        neox=("no_weight_tying",)),
    Row((), "the llama family's MLP has no biases (GPT-NeoX's ParallelMLP has them by default: listed as not "
        "migrated); GPT-NeoX's RMSNorm has no bias whatever use_bias_in_norms says", neox=("use_bias_in_mlp",
                                                                                           "use_bias_in_norms"))))

FAMILIES = (GPT2, T5, LLAMA, NEOX, NEOX_LLAMA, CPM2)
"""Ties in how well a run fits go to the earlier entry."""
EXPERTS_EXTEND = {"megatron": LLAMA, "neox": NEOX_LLAMA}
"""Per tool, the dense family whose runs with experts become the mixtral family (moe.py)."""
