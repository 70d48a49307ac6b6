"""Mixtral <-> Hugging Face `MixtralForCausalLM` (model_type 'mixtral'): Llama's name map and transforms
(convert/llama.py) with each block's MLP replaced by the sparse mixture, named as save_pretrained writes it:

    block_sparse_moe.gate.weight [experts, embed]          = our mlp/router_kernel [embed, experts] transposed
    block_sparse_moe.experts.E.w1.weight [mlp, embed]      = expert E of mlp/gate_kernel [experts, embed, mlp]
    block_sparse_moe.experts.E.w3.weight [mlp, embed]      = expert E of mlp/fc_kernel (the 'up' projection)
    block_sparse_moe.experts.E.w2.weight [embed, mlp]      = expert E of mlp/proj_kernel [experts, mlp, embed]

(transformers 5 fuses the experts in memory, `mlp.experts.gate_up_proj`, but reads and writes these names.) The
per-expert tensors are stacked on import and split on export (mapping.stacked_experts / per_expert), so the
name map holds one entry per stacked kernel.

Refused on import, in one line naming config.json and the value: an activation other than silu, a rotary
type other than default / llama3, a head_dim other than width / heads.
"""
from __future__ import annotations

from models.mixtral import MixtralConfig
from t5x_like.convert import llama, mapping, neox
from t5x_like.convert.mapping import EXPERTS_TRANSPOSED, Entry, Stack, per_expert, stacked_experts
from t5x_like.errors import UserError

HF_MODEL_TYPE = "mixtral"
TIED: dict[str, str] = {}
MOE = (Entry("block_sparse_moe.gate.weight", ("mlp/router_kernel",), neox.TRANSPOSED),
       Entry("block_sparse_moe.experts.w1.weight", ("mlp/gate_kernel",), EXPERTS_TRANSPOSED),
       Entry("block_sparse_moe.experts.w3.weight", ("mlp/fc_kernel",), EXPERTS_TRANSPOSED),
       Entry("block_sparse_moe.experts.w2.weight", ("mlp/proj_kernel",), EXPERTS_TRANSPOSED))
tied = llama.tied
BASE_MODEL_PREFIX = llama.BASE_MODEL_PREFIX
UNUSED_HF_TENSORS = llama.UNUSED_HF_TENSORS
tokenizer_config = llama.tokenizer_config
renamed_tensors = stacked_experts
exported_tensors = per_expert


def with_mlp(layout: tuple[tuple[Entry, ...], list[Stack]], mlp: tuple[Entry, ...]):
    """A Llama-class layout with each block's dense MLP entries (ours under mlp/) replaced by `mlp`."""
    top, stacks = layout
    return top, [stack._replace(entries=tuple(e for e in stack.entries if not e.ours[0].startswith("mlp/")) + mlp)
                 for stack in stacks]


def layout(config: MixtralConfig) -> tuple[tuple[Entry, ...], list[Stack]]:
    """Llama's (top-level entries, block stacks), each block's MLP the mixture's."""
    return with_mlp(llama.layout(config), MOE)


def config_to_hf(config: MixtralConfig, eod_id: int | None) -> dict:
    """config.json contents for transformers' MixtralConfig (unpadded vocabulary)."""
    hf = llama.config_to_hf(config, eod_id)
    for key in ("attention_bias", "mlp_bias"):
        hf.pop(key, None)
    hf.update(model_type=HF_MODEL_TYPE, architectures=["MixtralForCausalLM"], sliding_window=config.sliding_window,
              intermediate_size=config.expert_width, num_local_experts=config.num_experts,
              num_experts_per_tok=config.num_experts_per_token, router_aux_loss_coef=config.router_aux_loss_coef,
              router_jitter_noise=0.0, output_router_logits=False)
    return hf


def config_from_hf(hf: dict, source: str, **choices) -> MixtralConfig:
    """Our config from a HF Mixtral config.json; `choices` are ours alone (scan_layers, dtype, ...)."""
    heads = llama.checked_heads(hf, source)
    rope, rope_type = mapping.rope_of(hf, source)
    llama.refuse_unsupported(source, HF_MODEL_TYPE, {
        "hidden_act": (hf.get("hidden_act", "silu"), ("silu",)),
        "rope_type": (rope_type, llama.ROPE_TYPES),
    })
    if hf.get("head_dim") not in (None, hf["hidden_size"] // heads) or hf["hidden_size"] % heads:
        raise UserError(f"{source}: head_dim={hf.get('head_dim')}, hidden_size={hf['hidden_size']}, "
                        f"num_attention_heads={heads}: our mixtral needs heads of hidden_size / num_attention_heads, "
                        "a whole number; re-download or repair the model's config.json.")
    return MixtralConfig(**llama.shared_fields(hf, rope, rope_type), sliding_window=hf.get("sliding_window"),
                         **moe_fields(hf, "num_local_experts", normalize=True), **choices)


def moe_fields(hf: dict, experts_key: str, normalize: bool) -> dict:
    """Our MoEConfig fields from a config.json: the expert count (under `experts_key`, or the other name
    transformers writes), top-k, the router's loss weight; `normalize` when the file says nothing."""
    experts = hf.get(experts_key, hf.get("num_experts", hf.get("num_local_experts")))
    return dict(num_experts=experts, num_experts_per_token=hf["num_experts_per_tok"],
                normalize_router_weights=bool(hf.get("norm_topk_prob", normalize)),
                router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001))
