"""Qwen2-MoE <-> Hugging Face `Qwen2MoeForCausalLM` (model_type 'qwen2_moe', Qwen1.5-MoE): Llama's name map with
Qwen2's query/key/value biases (convert/llama.py), each block's MLP the mixture, named as save_pretrained writes it:

    mlp.gate.weight [experts, embed]                      = our mlp/router_kernel transposed
    mlp.experts.E.{gate,up,down}_proj.weight              = expert E of mlp/{gate,fc,proj}_kernel, transposed
    mlp.shared_expert.{gate,up,down}_proj.weight          = mlp/shared_expert/{gate,fc,proj}_kernel transposed
    mlp.shared_expert_gate.weight [1, embed]              = mlp/shared_gate_kernel [embed, 1] transposed

The per-expert tensors are stacked on import and split on export (mapping.stacked_experts / per_expert).

Refused on import, in one line naming config.json and the value: dense layers between the sparse ones
(decoder_sparse_step other than 1, a non-empty mlp_only_layers), use_sliding_window true, an activation other
than silu, a rotary type other than default / llama3.
"""
from __future__ import annotations

from models.qwen2_moe import Qwen2MoeConfig
from t5x_like.convert import llama, mapping, mixtral, neox
from t5x_like.convert.mapping import EXPERTS_TRANSPOSED, Entry, Stack, per_expert, stacked_experts

HF_MODEL_TYPE = "qwen2_moe"
TIED: dict[str, str] = {}
ROUTED = (Entry("mlp.gate.weight", ("mlp/router_kernel",), neox.TRANSPOSED),
          *(Entry(f"mlp.experts.{theirs}_proj.weight", (f"mlp/{ours}_kernel",), EXPERTS_TRANSPOSED)
            for theirs, ours in (("gate", "gate"), ("up", "fc"), ("down", "proj"))))
"""The router and the stacked experts (Qwen2-MoE's and Qwen3-MoE's names)."""
SHARED = (*(Entry(f"mlp.shared_expert.{theirs}_proj.weight", (f"mlp/shared_expert/{ours}_kernel",), neox.TRANSPOSED)
            for theirs, ours in (("gate", "gate"), ("up", "fc"), ("down", "proj"))),
          Entry("mlp.shared_expert_gate.weight", ("mlp/shared_gate_kernel",), neox.TRANSPOSED))
tied = llama.tied
BASE_MODEL_PREFIX = llama.BASE_MODEL_PREFIX
UNUSED_HF_TENSORS = llama.UNUSED_HF_TENSORS
tokenizer_config = llama.tokenizer_config
renamed_tensors = stacked_experts
exported_tensors = per_expert


def layout(config: Qwen2MoeConfig) -> tuple[tuple[Entry, ...], list[Stack]]:
    """Llama's (top-level entries, block stacks) with Qwen2's biases, each block's MLP the mixture's."""
    return mixtral.with_mlp(llama.layout(config), ROUTED + (SHARED if config.shared_expert_mlp_dim else ()))


def config_to_hf(config: Qwen2MoeConfig, eod_id: int | None) -> dict:
    """config.json contents for transformers' Qwen2MoeConfig (unpadded vocabulary; every layer sparse)."""
    hf = llama.config_to_hf(config, eod_id)
    hf.update(model_type=HF_MODEL_TYPE, architectures=["Qwen2MoeForCausalLM"], qkv_bias=config.qkv_bias,
              moe_intermediate_size=config.expert_width, num_experts=config.num_experts,
              num_experts_per_tok=config.num_experts_per_token, norm_topk_prob=config.normalize_router_weights,
              shared_expert_intermediate_size=config.shared_expert_mlp_dim or 0, decoder_sparse_step=1,
              mlp_only_layers=[], router_aux_loss_coef=config.router_aux_loss_coef, output_router_logits=False,
              max_window_layers=config.num_layers, layer_types=["full_attention"] * config.num_layers)
    return hf


def config_from_hf(hf: dict, source: str, **choices) -> Qwen2MoeConfig:
    """Our config from a HF Qwen2-MoE config.json; `choices` are ours alone (scan_layers, dtype, ...)."""
    llama.checked_heads(hf, source)
    rope, rope_type = mapping.rope_of(hf, source)
    llama.refuse_unsupported(source, HF_MODEL_TYPE, {
        "decoder_sparse_step": (hf.get("decoder_sparse_step", 1), (1,)),
        "mlp_only_layers": (hf.get("mlp_only_layers") or [], ([],)),
        "use_sliding_window": (hf.get("use_sliding_window", False), (False,)),
        "hidden_act": (hf.get("hidden_act", "silu"), ("silu",)),
        "rope_type": (rope_type, llama.ROPE_TYPES),
    })
    return Qwen2MoeConfig(**llama.shared_fields(hf, rope, rope_type), qkv_bias=bool(hf.get("qkv_bias", True)),
                          expert_mlp_dim=hf["moe_intermediate_size"],
                          shared_expert_mlp_dim=hf.get("shared_expert_intermediate_size") or None,
                          **mixtral.moe_fields(hf, "num_experts", normalize=False), **choices)
