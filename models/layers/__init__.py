"""The shared layer library every family composes (DESIGN.md, "Model families"):

    dense.py       logical parameters, activation axis names, the dense matmul (FP8 or not), Dense
    embeddings.py  Embed (lookup and output projection), tied_logits, mask_vocab_padding
    positions.py   Rotary embeddings (Llama 3.1's scaling too), T5's RelativePositionBias
    norms.py       LayerNorm, RMSNorm
    mlp.py         MLP (gated or not, activation by name, biases, dropout)
    moe.py         MoE (router, top-k experts by grouped matmuls or with a capacity, shared expert), router_losses
    kv_cache.py    the one decoding cache (keys/values, a context's keys/values, T5's positions)
    attention.py   Attention (self and cross, biases, rotary, grouped KV heads, additive bias, scale)
    stack.py       block_stack (scanned or unrolled, remat policies, the pipeline hook)
    decoder.py     DecoderOnly (embeddings, the stack of a family's blocks, final norm, output head) and
                   DecoderBlock (what a decoder-only family's own block is), which GPT-2, GPT-NeoX and Llama compose

A family file (models/<family>.py) imports `from models import layers` and uses the names below.
"""
from models.layers.attention import Attention
from models.layers.decoder import DecoderBlock, DecoderOnly, decoder_positions
from models.layers.dense import (BATCH_LENGTH_EMBED, BATCH_LENGTH_HEADS_KV, BATCH_LENGTH_MLP, BATCH_LENGTH_VOCAB,
                                 CACHE_BATCH_LENGTH, FP8_STATE, Dense, Einsum, dense_einsum, logical_param,
                                 normal_param, zeros_param)
from models.layers.embeddings import Embed, mask_vocab_padding, tied_logits
from models.layers.mlp import ACTIVATIONS, MLP
from models.layers.moe import ROUTER_STATS, MoE, router_losses
from models.layers.norms import LayerNorm, RMSNorm
from models.layers.positions import RelativePositionBias, Rotary, relative_position_bucket
from models.layers.stack import REMAT_POLICIES, STACKED, UNROLLED, LayerStack, block_stack, remat

__all__ = [
    "ACTIVATIONS", "Attention", "BATCH_LENGTH_EMBED", "BATCH_LENGTH_HEADS_KV", "BATCH_LENGTH_MLP",
    "BATCH_LENGTH_VOCAB", "CACHE_BATCH_LENGTH", "DecoderBlock", "DecoderOnly", "Dense", "Einsum", "Embed",
    "FP8_STATE", "LayerNorm", "LayerStack", "MLP", "MoE", "ROUTER_STATS", "REMAT_POLICIES", "RMSNorm", "RelativePositionBias",
    "Rotary", "STACKED", "UNROLLED", "block_stack", "decoder_positions", "dense_einsum", "logical_param",
    "mask_vocab_padding", "normal_param", "relative_position_bucket", "remat", "router_losses", "tied_logits", "zeros_param",
]
