"""Qwen3-MoE (Yang et al. 2025), as transformers' Qwen3MoeForCausalLM: Qwen3's decoder (models/qwen3.py: a
per-head RMSNorm on queries and keys before the rotary embeddings, heads of their own width head_dim, no biases)
whose blocks' MLP is a mixture of SwiGLU experts (models.layers.MoE) without a shared expert, the router's top-k
probabilities renormalised (transformers' norm_topk_prob, true in the published models). Every block is sparse.

Parameter tree: Qwen3's, each block's mlp (models.layers.moe):

    blocks/mlp/{router_kernel [embed, experts], gate_kernel, fc_kernel [experts, embed, expert_mlp],
                proj_kernel [experts, expert_mlp, embed]}
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from models.config import MoEConfig
from models.mixtral import MoEBlock
from models.qwen3 import Qwen3, Qwen3Block, Qwen3Config
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class Qwen3MoeConfig(MoEConfig, Qwen3Config):
    """Qwen3Config's fields (head_dim, query/key norms) and MoEConfig's experts, each expert_mlp_dim wide (the
    defaults: Qwen3-30B-A3B's); mlp_dim is transformers' intermediate_size, which no sparse block uses (kept for
    the round trip). The presets are in configs/qwen3_moe.py."""

    ABSENT: ClassVar[dict[str, tuple[Any, str]]] = {**Qwen3Config.ABSENT, "shared_expert_mlp_dim": (None, "qwen2_moe")}

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = Qwen3Config.POSITIVE_FIELDS + MoEConfig.MOE_POSITIVE_FIELDS

    family: str = "qwen3_moe"
    num_experts: int = 128
    num_experts_per_token: int = 8
    expert_mlp_dim: int | None = 768


class Qwen3MoeBlock(MoEBlock, Qwen3Block):
    """Qwen3's block (its attention, Qwen3Block's) with the mixture of experts as its MLP (MoEBlock's)."""

    config: Qwen3MoeConfig


class Qwen3Moe(Qwen3):
    config: Qwen3MoeConfig
    block = Qwen3MoeBlock


FAMILIES = {"qwen3_moe": Family(Qwen3MoeConfig, Qwen3Moe, "decoder_only")}
