"""Qwen3 dense decoders in Flax Linen, as transformers' Qwen3ForCausalLM (Yang et al. 2025): Llama's block
(models/llama.py: pre-norm RMSNorm, h = x + attn(ln_1 x), then h + mlp(ln_2 h), a SwiGLU MLP, rotary grouped-query
attention, no biases) with two changes: an RMSNorm over each head of the queries and of the keys before the
rotary embeddings (transformers' q_norm / k_norm), and heads of their own width, `head_dim` (128 in every
published size), not tied to embed_dim / num_heads: Qwen3-0.6B projects its 1024 wide stream to 16 query heads
of 128. The small sizes tie the output head to the input embedding, as Llama's option does.

Parameter tree (Llama's, plus the two norms; scan_layers=True stacks the blocks under `blocks`):

    embed_in/embedding [padded_vocab, embed]   embed_out/embedding [padded_vocab, embed] (untied only)
    blocks/{ln_1/scale, attn/{query,key,value,out}_kernel, attn/{query,key}_norm/scale [head_dim], ln_2/scale,
            mlp/{gate,fc,proj}_kernel}
    ln_f/scale
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from models import layers
from models.llama import Llama, LlamaBlock, LlamaConfig
from models.registry import Family


@dataclasses.dataclass(frozen=True)
class Qwen3Config(LlamaConfig):
    """Llama's fields with Qwen3's defaults, and `head_dim`, the width of each query/key/value head (free of
    the width: heads x head_dim need not be embed_dim). Qwen3 has no query/key/value biases and no sliding
    window (their fields must stay off); its query/key norms take layer_norm_eps."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = LlamaConfig.POSITIVE_FIELDS + ("head_dim",)

    family: str = "qwen3"
    vocab_size: int = 151936
    max_len: int = 40960
    head_dim: int = 128
    """Each head's width (transformers' head_dim; the rotary embeddings turn all of it)."""
    rope_theta: float = 1e6
    layer_norm_eps: float = 1e-6

    ABSENT: ClassVar[dict[str, tuple[Any, str]]] = {"qkv_bias": (False, "llama"), "sliding_window": (None, "llama")}

    def check_heads(self) -> None:
        """Heads of head_dim: any count, whatever the width."""

    def block_notes(self) -> str:
        return ", query/key RMSNorm" + super().block_notes()


class Qwen3Block(LlamaBlock):
    """LlamaBlock whose attention normalises each query and key head (RMSNorm, layer_norm_eps) before the
    rotary embeddings."""

    config: Qwen3Config

    def attention(self, **options) -> layers.Attention:
        return super().attention(qk_norm_eps=self.config.layer_norm_eps, **options)


class Qwen3(Llama):
    """Llama's decoder (token embeddings, the blocks, RMSNorm, the head tied or not) over Qwen3Blocks."""

    config: Qwen3Config
    block = Qwen3Block


FAMILIES = {"qwen3": Family(Qwen3Config, Qwen3, "decoder_only")}
