"""Qwen2-MoE (Qwen1.5-MoE, Qwen Team 2024), as transformers' Qwen2MoeForCausalLM: Qwen2's decoder (models/llama.py:
rotary grouped-query attention with biases on query, key and value, RMSNorm, an untied head) whose blocks' MLP is
a mixture of SwiGLU experts (models.layers.MoE) plus a shared expert every token takes, scaled by a sigmoid gate.
The router's top-k probabilities are not renormalised (transformers' norm_topk_prob false), unlike Mixtral's.
Every block is sparse (transformers' decoder_sparse_step 1, no mlp_only_layers) and there is no sliding window.

Parameter tree: the Llama tree with Qwen2's biases, each block's mlp (models.layers.moe):

    blocks/mlp/{router_kernel [embed, experts], gate_kernel, fc_kernel [experts, embed, expert_mlp],
                proj_kernel [experts, expert_mlp, embed], shared_expert/{gate,fc,proj}_kernel,
                shared_gate_kernel [embed, 1]}
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from models.config import MoEConfig
from models.llama import LlamaConfig
from models.mixtral import Mixtral, MoEBlock
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class Qwen2MoeConfig(MoEConfig, LlamaConfig):
    """LlamaConfig's fields with Qwen2's defaults (biases on query, key and value) and MoEConfig's experts: each
    expert expert_mlp_dim wide, a shared expert shared_expert_mlp_dim wide (the defaults: Qwen1.5-MoE-A2.7B's);
    mlp_dim is transformers' intermediate_size, which no sparse block uses (kept for the round trip). The presets
    are in configs/qwen2_moe.py."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = LlamaConfig.POSITIVE_FIELDS + MoEConfig.MOE_POSITIVE_FIELDS

    family: str = "qwen2_moe"
    vocab_size: int = 151936
    max_len: int = 8192
    qkv_bias: bool = True
    rope_theta: float = 1e6
    layer_norm_eps: float = 1e-6
    num_experts: int = 60
    num_experts_per_token: int = 4
    expert_mlp_dim: int | None = 1408
    normalize_router_weights: bool = False
    shared_expert_mlp_dim: int | None = 5632
    ABSENT: ClassVar[dict[str, tuple[Any, str]]] = {"sliding_window": (None, "mixtral")}


class Qwen2MoeBlock(MoEBlock):
    """Llama's block with Qwen2's query/key/value biases and the mixture (with its shared expert) as the MLP."""

    config: Qwen2MoeConfig


class Qwen2Moe(Mixtral):
    config: Qwen2MoeConfig
    block = Qwen2MoeBlock


FAMILIES = {"qwen2_moe": Family(Qwen2MoeConfig, Qwen2Moe, "decoder_only")}
