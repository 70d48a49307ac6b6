"""Mixtures of experts: Megatron-Core's MoE flags and GPT-NeoX's moe_* keys -> the mixtral family's expert fields
(models/config.py's MoEConfig). A run with experts (--num-experts, or moe_num_experts > 1) whose dense
architecture has RMSNorm, a SwiGLU MLP and rotary embeddings becomes
the mixtral family, every layer's MLP a mixture of SwiGLU experts; another (GELU experts, LayerNorm) has no family
here and is refused. The experts' mesh axis and the routing choices with no equivalent are moe_parallel.py's."""
from __future__ import annotations

import dataclasses
from typing import Mapping

import models

from t5x_like.errors import UserError
from t5x_like.migration.families import EXPERTS_EXTEND, llama_fields, neox_llama_fields
from t5x_like.migration.family import Family, Fields, decoder_lengths
from t5x_like.migration.rows import Row
from t5x_like.migration.translate import Out, provenance
from t5x_like.migration.upstream import Setting, Upstream

EXPERT_KEYS = {"megatron": "num_experts", "neox": "moe_num_experts"}
BALANCING = {"aux_loss": "the load-balancing loss", "none": "no balancing loss: coefficient 0"}
LOSS_FORM = ("the loss here is transformers' load_balancing_loss_func over all layers' tokens together (a token's "
             "k assignments counted, so its balanced value is k); {tool} adds each layer's own (balanced value 1 "
             "each): the same coefficient pulls about num_layers / k times less here")


def experts(settings: Mapping[str, Setting], kind: str) -> Setting | None:
    """The setting that gives the run experts, None for a dense run (NeoX's moe_num_experts 1 is dense)."""
    setting = settings.get(EXPERT_KEYS.get(kind, ""))
    if setting is None or (kind == "neox" and setting.number(int) <= 1):
        return None
    return setting


def with_experts(upstream: Upstream, dense: Family) -> Family:
    """The family a run becomes: `dense` without experts, else the mixtral family of its tool (its dense
    architecture RMSNorm / SwiGLU / rotary), else a UserError naming the setting and what migrates."""
    setting = experts(upstream.settings, upstream.kind)
    if setting is None:
        return dense
    if dense is not EXPERTS_EXTEND[upstream.kind]:
        needs = ", ".join(f"{f.setting} {f.builds}" for f in EXPERTS_EXTEND[upstream.kind].features)
        raise UserError(f"{setting.where}: {setting.spelled} {setting.value}: a mixture of experts migrates only "
                        f"as the mixtral family (SwiGLU experts; {needs}); this run's dense "
                        f"architecture is the {dense.name} family's (GELU MLP, LayerNorm), which has no experts here.")
    return MIXTRAL if upstream.kind == "megatron" else NEOX_MIXTRAL


def skip_dense(upstream: Upstream, out: Out, rows: tuple[Row, ...]) -> None:
    """A dense run's MoE settings are read (never 'not recognised') and listed as having no effect."""
    for row in rows:
        for key in sorted(row.keys()):
            out.skip(upstream.get(key), f"no {EXPERT_KEYS[upstream.kind]} > 1: the model is dense, this has no "
                                        "effect")


def balancing(upstream: Upstream, out: Out, coefficient: tuple[float, str]) -> tuple[float, str]:
    """Megatron's --moe-router-load-balancing-type (a name, or several): aux_loss is the loss here, none its
    coefficient 0; sinkhorn, seq_aux_loss and global_aux_loss are approximated by the loss here."""
    kind = upstream.get("moe_router_load_balancing_type")
    names = [] if kind is None else kind.value if isinstance(kind.value, list) else [str(kind.value)]
    if names == ["none"]:
        return 0.0, f"{provenance(kind)}: no balancing loss"
    other = [name for name in names if name not in ("aux_loss", "none")]
    if other:
        out.skip(kind, f"{', '.join(other)} has no equivalent (sinkhorn: balanced assignment by Sinkhorn "
                       "iterations; seq_aux_loss: the loss per sequence; global_aux_loss: over the global batch): "
                       "routing here is top-k of the router's softmax, balanced by the load-balancing loss over the "
                       "batch at router_aux_loss_coef (from --moe-aux-loss-coeff); this model's routing differs")
    return coefficient


def megatron_moe(upstream: Upstream, out: Out, mlp_dim: int) -> Fields:
    fields: Fields = {}
    count = upstream.get("num_experts")
    fields["num_experts"] = (count.number(int), provenance(count))
    topk = upstream.get("moe_router_topk")
    fields["num_experts_per_token"] = (2, f"2: {out.default()}") if topk is None else (topk.number(int),
                                                                                       provenance(topk))
    width = upstream.get("moe_ffn_hidden_size")
    fields["expert_mlp_dim"] = (None, "--ffn-hidden-size: Megatron's default") if width is None or \
        width.number(int) == mlp_dim else (width.number(int), provenance(width))
    pre = upstream.get("moe_router_pre_softmax")
    fields["normalize_router_weights"] = (False, f"{provenance(pre)}: the top-k of the softmax, not renormalised") \
        if pre is not None and pre.flag() else (True, "no --moe-router-pre-softmax: Megatron's softmax over the "
                                                      "top-k logits, the renormalised top-k probabilities")
    coefficient = upstream.get("moe_aux_loss_coeff")
    aux = (0.0, f"0: {out.default()}") if coefficient is None else (coefficient.number(), provenance(coefficient))
    fields["router_aux_loss_coef"] = balancing(upstream, out, aux)
    if fields["router_aux_loss_coef"][0]:
        out.notes.append(f"{fields['router_aux_loss_coef'][1]}: {LOSS_FORM.format(tool='Megatron-Core')}")
    z = upstream.get("moe_z_loss_coeff")
    fields["router_z_loss_coef"] = (0.0, f"0: {out.default()}") if z is None else (z.number(), provenance(z))
    capacity = upstream.get("moe_expert_capacity_factor")
    fields["capacity_factor"] = (None, f"dropless: {out.default()}") if capacity is None else (
        capacity.number(), provenance(capacity))
    shared = upstream.get("moe_shared_expert_intermediate_size")
    fields["shared_expert_mlp_dim"] = (None, "no shared expert") if shared is None else (shared.number(int),
                                                                                         provenance(shared))
    gate = upstream.get("moe_shared_expert_gate")
    if shared is not None and (gate is None or not gate.flag()):
        out.skip(shared, "the shared expert here is behind a sigmoid gate (Qwen2-MoE's); without "
                         "--moe-shared-expert-gate Megatron adds it ungated: this model differs from upstream's here")
    return fields


def megatron_differences(upstream: Upstream, out: Out, capacity: float | None) -> None:
    """Megatron-Core's MoE choices the mixtral family does not build, listed as not migrated."""
    for key, same, reason in (
            ("moe_layer_freq", "1", "every layer's MLP is a mixture of experts here"),
            ("moe_router_score_function", "softmax", "the router here takes a softmax of its logits"),
            ("moe_token_drop_policy", "probs" if capacity is None else "position",
             "with a capacity factor, an expert here keeps its first assignments in token order (Megatron's "
             "'position'), not the most probable")):
        setting = upstream.get(key)
        if key == "moe_token_drop_policy" and capacity is not None and setting is None:
            out.skipped.append((f"--moe-token-drop-policy not set: probs, {out.default()}", reason))
        elif setting is not None and str(setting.value) != same:
            out.skip(setting, f"{reason}: this model differs from upstream's here")
    pad = upstream.get("moe_pad_expert_input_to_capacity")
    if pad is not None and capacity is None:
        out.skip(pad, "no --moe-expert-capacity-factor: dropless, nothing to pad")
    for key, reason in (("moe_router_topk_scaling_factor", "the top-k weights here are not scaled"),
                        ("moe_input_jitter_eps", "the router's input is not jittered here"),
                        ("moe_router_enable_expert_bias", "no auxiliary-loss-free expert bias here"),
                        ("moe_router_bias_update_rate", "no auxiliary-loss-free expert bias here"),
                        ("moe_router_num_groups", "no group-limited routing here"),
                        ("moe_router_group_topk", "no group-limited routing here")):
        setting = upstream.get(key)
        if setting is not None and setting.value not in (False, None, "None"):
            out.skip(setting, f"{reason}: this model differs from upstream's here")


def mixtral_fields(upstream: Upstream, out: Out) -> Fields:
    """Megatron-Core's GPT model with RMSNorm, SwiGLU, rotary embeddings and --num-experts."""
    fields = llama_fields(upstream, out)
    fields.update(megatron_moe(upstream, out, fields["mlp_dim"][0]))
    megatron_differences(upstream, out, fields["capacity_factor"][0])
    return fields


NEOX_DEFAULTS = {"moe_top_k": 1, "moe_loss_coeff": 0.1, "moe_type": "megablocks", "moe_train_capacity_factor": 1.0,
                 "moe_eval_capacity_factor": 1.0, "moe_min_capacity": 4, "moe_token_dropping": False,
                 "moe_use_residual": True, "moe_glu": False, "expert_interval": 2}
"""GPT-NeoX's defaults (megatron/neox_arguments/neox_args.py) for what a config leaves unsaid."""


def neox_value(upstream: Upstream, out: Out, key: str) -> tuple[object, str]:
    setting = upstream.get(key)
    if setting is None:
        return NEOX_DEFAULTS[key], f"{key} not set: {NEOX_DEFAULTS[key]}, {out.default()}"
    return setting.value, provenance(setting)


def neox_capacity(upstream: Upstream, out: Out) -> tuple[float | None, str]:
    """megablocks (NeoX's default) is dropless; DeepSpeed's MoE drops past the train capacity factor only with
    moe_token_dropping (without it, each expert's capacity grows to what it is sent)."""
    kind, kind_why = neox_value(upstream, out, "moe_type")
    dropping, dropping_why = neox_value(upstream, out, "moe_token_dropping")
    train, train_why = neox_value(upstream, out, "moe_train_capacity_factor")
    evaluation, _ = neox_value(upstream, out, "moe_eval_capacity_factor")
    minimum = upstream.get("moe_min_capacity")
    if kind != "deepspeed" or not dropping:
        why = kind_why if kind != "deepspeed" else dropping_why
        for key in ("moe_train_capacity_factor", "moe_eval_capacity_factor", "moe_min_capacity"):
            out.skip(upstream.get(key), f"{why}: dropless, no capacity")
        return None, f"{why}: dropless"
    if float(evaluation) != float(train):
        out.skip(upstream.get("moe_eval_capacity_factor"), "one capacity factor here, in training and evaluation "
                                                           "(moe_train_capacity_factor's)")
    out.skipped.append((provenance(minimum, f"moe_min_capacity not set: 4, {out.default()}"),
                        "no minimum capacity here: an expert takes ceil(capacity_factor x tokens x k / experts)"))
    return float(train), f"{train_why} ({dropping_why}): assignments past it are dropped in token order"


def neox_moe(upstream: Upstream, out: Out) -> Fields:
    fields: Fields = {}
    count = upstream.get("moe_num_experts")
    fields["num_experts"] = (count.number(int), provenance(count))
    topk, why = neox_value(upstream, out, "moe_top_k")
    fields["num_experts_per_token"] = (int(topk), why)
    kind, kind_why = neox_value(upstream, out, "moe_type")
    normalised = kind == "deepspeed" and int(topk) == 2
    fields["normalize_router_weights"] = (normalised, f"{kind_why}: " + (
        "DeepSpeed's top-2 gating renormalises the two probabilities" if normalised else
        "the top-k of the router's softmax, not renormalised"))
    coefficient, why = neox_value(upstream, out, "moe_loss_coeff")
    fields["router_aux_loss_coef"] = (float(coefficient), why)
    out.notes.append(f"{why}: {LOSS_FORM.format(tool='GPT-NeoX')}")
    fields["router_z_loss_coef"] = (0.0, "GPT-NeoX has no router z-loss")
    fields["capacity_factor"] = neox_capacity(upstream, out)
    glu, why = neox_value(upstream, out, "moe_glu")
    if kind != "deepspeed" and not glu:
        out.skipped.append((why, "the experts here are SwiGLU MLPs; megablocks' without moe_glu are ungated: this "
                                 "model differs from upstream's here"))
    residual, why = neox_value(upstream, out, "moe_use_residual")
    if kind == "deepspeed" and residual:
        out.skipped.append((why, "DeepSpeed's residual MoE (a dense MLP mixed in by a learned coefficient) has no "
                                 "equivalent: this model differs from upstream's here"))
    interval, why = neox_value(upstream, out, "expert_interval")
    if int(interval) != 1:
        out.skipped.append((why, f"every layer's MLP is a mixture of experts here (upstream: every {interval}th, the "
                                 "others dense): this model differs from upstream's here"))
    jitter = upstream.get("moe_jitter_eps")
    if jitter is not None and jitter.value is not None:
        out.skip(jitter, "the router's input is not jittered here: this model differs from upstream's here")
    return fields


def neox_mixtral_fields(upstream: Upstream, out: Out) -> Fields:
    """GPT-NeoX's RMSNorm / SwiGLU configs with moe_num_experts > 1: each expert as wide as the dense MLP would be."""
    fields = neox_llama_fields(upstream, out)
    fields.update(neox_moe(upstream, out))
    return fields


MEGATRON_ROWS = (
    Row(("overrides.num_experts",), "with --swiglu, RMSNorm and rotary embeddings, the mixtral family (a GPT-2-class run with "
        "experts is refused: no GELU experts here)", megatron=("--num-experts",)),
    Row(("overrides.num_experts_per_token",), "Megatron's default 2", megatron=("--moe-router-topk",)),
    Row(("overrides.expert_mlp_dim",), "default --ffn-hidden-size", megatron=("--moe-ffn-hidden-size",)),
    Row(("overrides.router_aux_loss_coef",), "Megatron's default 0; 'aux_loss' is the loss here, 'none' its "
        "coefficient 0; 'sinkhorn', 'seq_aux_loss', 'global_aux_loss' are approximated by it (listed). The loss is "
        "transformers' (all layers' tokens together), not a sum of per-layer losses (a note says so)",
        megatron=("--moe-aux-loss-coeff", "--moe-router-load-balancing-type")),
    Row(("overrides.router_z_loss_coef",), megatron=("--moe-z-loss-coeff",)),
    Row(("overrides.capacity_factor",), "unset: dropless; with it an expert keeps its first assignments in token "
        "order ('position'; Megatron's default 'probs' is listed); fixed-size buffers, as if padded to capacity",
        megatron=("--moe-expert-capacity-factor", "--moe-token-drop-policy", "--moe-pad-expert-input-to-capacity")),
    Row(("overrides.normalize_router_weights",), "Megatron's softmax over the top-k logits is the renormalised "
        "top-k probabilities (True); with --moe-router-pre-softmax, the top-k of the softmax (False)",
        megatron=("--moe-router-pre-softmax",)),
    Row(("overrides.shared_expert_mlp_dim",), "the shared expert here is behind a sigmoid gate (listed without "
        "--moe-shared-expert-gate)", megatron=("--moe-shared-expert-intermediate-size", "--moe-shared-expert-gate")),
    Row((), "every layer's MLP is a mixture of experts, routed by a softmax, its weights unscaled, its input not "
        "jittered, without expert bias or group-limited routing: another value is listed as not migrated",
        megatron=("--moe-layer-freq", "--moe-router-score-function", "--moe-router-topk-scaling-factor",
                  "--moe-input-jitter-eps", "--moe-router-enable-expert-bias", "--moe-router-bias-update-rate",
                  "--moe-router-num-groups", "--moe-router-group-topk")),
)
NEOX_ROWS = (
    Row(("overrides.num_experts",), "> 1 with RMSNorm, a SwiGLU MLP and rotary embeddings: the mixtral family; a GELU / "
        "LayerNorm config with experts is refused", neox=("moe_num_experts",)),
    Row(("overrides.num_experts_per_token",), "GPT-NeoX's default 1", neox=("moe_top_k",)),
    Row(("overrides.router_aux_loss_coef",), "GPT-NeoX's default 0.1 (the loss's form differs: a note says so)",
        neox=("moe_loss_coeff",)),
    Row(("overrides.capacity_factor", "overrides.normalize_router_weights"), "megablocks (the default) is dropless "
        "with the top-k probabilities as they are; deepspeed drops past moe_train_capacity_factor only with "
        "moe_token_dropping (one factor here; no minimum capacity, listed) and renormalises top-2",
        neox=("moe_type", "moe_train_capacity_factor", "moe_eval_capacity_factor", "moe_min_capacity",
              "moe_token_dropping")),
    Row((), "every layer's MLP is a mixture of SwiGLU experts (GPT-NeoX's default expert_interval 2, megablocks "
        "without moe_glu, DeepSpeed's residual MoE and a jittered router are listed as not migrated)",
        neox=("expert_interval", "moe_glu", "moe_use_residual", "moe_jitter_eps")),
)
MIXTRAL = Family("mixtral", "megatron", "mixtral_8x7b", mixtral_fields, decoder_lengths, programs=("gpt",),
                 features=EXPERTS_EXTEND["megatron"].features, rows=MEGATRON_ROWS)
NEOX_MIXTRAL = Family("mixtral", "neox", "mixtral_8x7b", neox_mixtral_fields, decoder_lengths,
                      features=EXPERTS_EXTEND["neox"].features, rows=NEOX_ROWS)
FAMILIES = (MIXTRAL, NEOX_MIXTRAL)
"""Chosen by with_experts, never by fit: a run's experts decide; exportable_family may make one qwen2_moe."""
QWEN2_MOE_PRESET = "qwen1_5_moe_a2_7b"


def exportable_family(family: Family, fields: Fields, out: Out) -> Family:
    """The mixtral family builds transformers' Mixtral (renormalised top-k, no shared expert, experts as wide as
    mlp_dim, no biases); experts with any other of these are the qwen2_moe family's, which has each option, so the
    migrated model exports as it trains. Each such option then goes into `fields` (as Mixtral's where upstream
    leaves it unsaid), so none takes the Qwen2-MoE preset's value."""
    if family.name != MIXTRAL.name:
        return family
    mixtral = models.FAMILIES[MIXTRAL.name].config
    options = {**{name: value for name, (value, _) in mixtral.ABSENT.items()}, "expert_mlp_dim": None}
    differs = [name for name, value in options.items() if fields.get(name, (value,))[0] != value]
    if fields.get("expert_mlp_dim", (None,))[0] == fields["mlp_dim"][0]:
        differs.remove("expert_mlp_dim")
    if not differs:
        return family
    out.notes.append(f"the qwen2_moe family, not mixtral: {', '.join(differs)} as upstream has them, which "
                     "transformers' Mixtral (the mixtral family) has not")
    for name, value in options.items():
        fields.setdefault(name, (value, f"{out.default()}, as Mixtral's"))
    return dataclasses.replace(family, name="qwen2_moe", base_preset=QWEN2_MOE_PRESET)
