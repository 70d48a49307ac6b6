"""Qwen3-MoE <-> Hugging Face `Qwen3MoeForCausalLM` (model_type 'qwen3_moe'): Qwen3's name map (convert/qwen3.py:
Llama's plus the query/key norms) with each block's MLP the mixture, named as save_pretrained writes it (Qwen2-MoE's
names without the shared expert: convert/qwen2_moe.py):

    mlp.gate.weight [experts, embed]                      = our mlp/router_kernel transposed
    mlp.experts.E.{gate,up,down}_proj.weight              = expert E of mlp/{gate,fc,proj}_kernel, transposed

Refused on import, in one line naming config.json and the value: dense layers between the sparse ones
(decoder_sparse_step other than 1, a non-empty mlp_only_layers), a sliding window, attention_bias true, an
activation other than silu, a rotary type other than default / llama3.
"""
from __future__ import annotations

from models.qwen3_moe import Qwen3MoeConfig
from t5x_like.convert import llama, mapping, mixtral, qwen2_moe, qwen3
from t5x_like.convert.mapping import Entry, Stack, per_expert, stacked_experts

HF_MODEL_TYPE = "qwen3_moe"
TIED: dict[str, str] = {}
tied = llama.tied
BASE_MODEL_PREFIX = llama.BASE_MODEL_PREFIX
UNUSED_HF_TENSORS = llama.UNUSED_HF_TENSORS
tokenizer_config = llama.tokenizer_config
renamed_tensors = stacked_experts
exported_tensors = per_expert


def layout(config: Qwen3MoeConfig) -> tuple[tuple[Entry, ...], list[Stack]]:
    """Qwen3's (top-level entries, block stacks), each block's MLP the mixture's."""
    return mixtral.with_mlp(qwen3.layout(config), qwen2_moe.ROUTED)


def config_to_hf(config: Qwen3MoeConfig, eod_id: int | None) -> dict:
    """config.json contents for transformers' Qwen3MoeConfig (unpadded vocabulary; every layer sparse)."""
    hf = qwen3.config_to_hf(config, eod_id)
    hf.update(model_type=HF_MODEL_TYPE, architectures=["Qwen3MoeForCausalLM"],
              moe_intermediate_size=config.expert_width, num_experts=config.num_experts,
              num_experts_per_tok=config.num_experts_per_token, norm_topk_prob=config.normalize_router_weights,
              decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=config.router_aux_loss_coef,
              output_router_logits=False)
    return hf


def config_from_hf(hf: dict, source: str, **choices) -> Qwen3MoeConfig:
    """Our config from a HF Qwen3-MoE config.json; `choices` are ours alone (scan_layers, dtype, ...)."""
    llama.checked_heads(hf, source)
    rope, rope_type = mapping.rope_of(hf, source)
    layer_types = hf.get("layer_types") or ["full_attention"]
    llama.refuse_unsupported(source, HF_MODEL_TYPE, {
        "decoder_sparse_step": (hf.get("decoder_sparse_step", 1), (1,)),
        "mlp_only_layers": (hf.get("mlp_only_layers") or [], ([],)),
        "use_sliding_window": (hf.get("use_sliding_window", False), (False,)),
        "layer_types": (sorted(set(layer_types)), (["full_attention"],)),
        "attention_bias": (hf.get("attention_bias", False), (False,)),
        "hidden_act": (hf.get("hidden_act", "silu"), ("silu",)),
        "rope_type": (rope_type, llama.ROPE_TYPES),
    })
    return Qwen3MoeConfig(**llama.shared_fields(hf, rope, rope_type), head_dim=hf.get("head_dim", 128),
                          expert_mlp_dim=hf["moe_intermediate_size"],
                          **mixtral.moe_fields(hf, "num_experts", normalize=False), **choices)
