"""Mixtral (Jiang et al. 2024), as transformers' MixtralForCausalLM: Mistral's decoder (models/llama.py: rotary
grouped-query attention, RMSNorm, an untied head, a sliding window when set) whose blocks' MLP is a sparse
mixture of SwiGLU experts (models.layers.MoE), each token routed to its top-k experts by a softmax router,
their probabilities renormalised over the k.

Parameter tree: the Llama tree, with each block's mlp (models.layers.moe):

    blocks/mlp/{router_kernel [embed, experts], gate_kernel, fc_kernel [experts, embed, mlp],
                proj_kernel [experts, mlp, embed]}
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax

from models.config import MoEConfig
from models.llama import Llama, LlamaBlock, LlamaConfig
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class MixtralConfig(MoEConfig, LlamaConfig):
    """A Llama-class config (LlamaConfig's fields) with MoEConfig's experts; the presets are in configs/mixtral.py."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = LlamaConfig.POSITIVE_FIELDS + MoEConfig.MOE_POSITIVE_FIELDS

    ABSENT: ClassVar[dict[str, tuple[Any, str]]] = {
        "shared_expert_mlp_dim": (None, "qwen2_moe"), "normalize_router_weights": (True, "qwen2_moe"),
        "qkv_bias": (False, "qwen2_moe")}
    """transformers' Mixtral: renormalised top-k, no shared expert, no biases (Qwen2-MoE has each)."""

    family: str = "mixtral"
    rope_theta: float = 1e6

    def __post_init__(self):
        super().__post_init__()
        if self.expert_mlp_dim not in (None, self.mlp_dim):
            raise ValueError(f"expert_mlp_dim {self.expert_mlp_dim}: mixtral's experts are mlp_dim ({self.mlp_dim}) "
                             "wide (transformers' intermediate_size); set mlp_dim, or use family 'qwen2_moe' for "
                             "experts narrower than its dense MLP.")


class MoEBlock(LlamaBlock):
    """LlamaBlock with the mixture of experts as its feed-forward (padding tokens, segment 0, are left out of
    the router's statistics and of the experts' capacity)."""

    config: MixtralConfig

    def feed_forward(self, h: jax.Array, segment_ids: jax.Array | None) -> jax.Array:
        c = self.config
        return c.moe_layer("silu", c.init_std, c.init_std)(h, None if segment_ids is None else segment_ids != 0)


class Mixtral(Llama):
    config: MixtralConfig
    block = MoEBlock


FAMILIES = {"mixtral": Family(MixtralConfig, Mixtral, "decoder_only")}
