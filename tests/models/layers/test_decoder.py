"""models/layers/decoder.py: the shared decoder-only model composes its blocks from the config's options
(norm, gated MLP and activation, biases, grouped key/value heads, rotary, parallel or sequential residual),
each block is exactly its layers put together, and decoding positions are checked."""
import dataclasses
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models.config import DecoderOnlyConfig
from tests.models.layers.references import TOL, init


@dataclasses.dataclass(frozen=True)
class LlamaLike(DecoderOnlyConfig):
    """Options other than GPT-2's and GPT-NeoX's: RMS norms, gated SiLU, no biases, 2 key/value heads."""

    family: str = "llama_like"
    vocab_size: int = 50
    num_layers: int = 2
    num_heads: int = 4
    embed_dim: int = 16
    mlp_dim: int = 24
    max_len: int = 8
    num_kv_heads: int = 2
    """A field where GPT-2 and GPT-NeoX have DecoderOnlyConfig's property (as many as num_heads)."""
    use_parallel_residual: bool = False
    dropout_rate: float = 0.0
    attention_dropout_rate: float = 0.0

    mlp_activation: ClassVar[str] = "silu"
    gated_mlp: ClassVar[bool] = True
    norm: ClassVar[str] = "rms"
    qkv_bias: ClassVar[bool] = False
    out_bias: ClassVar[bool] = False
    mlp_bias: ClassVar[bool] = False
    input_init_std: ClassVar[float] = 0.1
    output_init_std: ClassVar[float] = 0.05

    @property
    def rotary(self):
        return layers.Rotary(self.head_dim, 500000.0)


class Model(layers.DecoderOnly):
    def setup(self):
        c = self.config
        self.tokens = layers.Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), 0.1)
        self.head = layers.Embed(c.padded_vocab_size, c.embed_dim, ("vocab", "embed"), 0.1)

    def embed(self, tokens, positions):
        return self.tokens(tokens)

    def output_table(self):
        return self.head.embedding


def shapes(tree):
    return {jax.tree_util.keystr(path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_options_shape_the_blocks():
    config = LlamaLike()
    assert config.num_kv_heads == 2 and LlamaLike(num_kv_heads=4).num_kv_heads == 4
    with pytest.raises(ValueError, match="num_kv_heads 3 does not divide num_heads 4"):
        LlamaLike(num_kv_heads=3)
    params = nn.meta.unbox(init(Model(config), 0, jnp.zeros((1, 8), jnp.int32))["params"])
    blocks = shapes(params["blocks"])
    assert blocks == {
        "['attn']['query_kernel']": (2, 16, 4, 4), "['attn']['key_kernel']": (2, 16, 2, 4),
        "['attn']['value_kernel']": (2, 16, 2, 4), "['attn']['out_kernel']": (2, 4, 4, 16),
        "['ln_1']['scale']": (2, 16), "['ln_2']['scale']": (2, 16),
        "['mlp']['fc_kernel']": (2, 16, 24), "['mlp']['gate_kernel']": (2, 16, 24),
        "['mlp']['proj_kernel']": (2, 24, 16)}
    assert shapes(params["ln_f"]) == {"['scale']": (16,)}
    assert sorted(params) == ["blocks", "head", "ln_f", "tokens"]
    e, m, kv = 16, 24, 2 * 4
    assert config.matmul_params() == 2 * (2 * e * 16 + 2 * e * kv + 3 * e * m) + 50 * e
    assert config.summary().startswith("llama_like: 2 layers, width 16, 4 heads x 4 (2 key/value heads) (rotary on 4)")


@pytest.mark.parametrize("parallel", [False, True])
def test_a_block_is_its_layers_put_together(parallel):
    config = LlamaLike(use_parallel_residual=parallel)
    block = layers.DecoderBlock(config, True)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 16)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    params = nn.meta.unbox(init(block, 1, x, None, positions)["params"])
    attention = layers.Attention(4, 4, 0.1, 0.05, num_kv_heads=2, rotary=config.rotary, attention="xla")
    mlp = layers.MLP(24, "silu", 0.1, 0.05, gated=True)
    norm = layers.RMSNorm(config.layer_norm_eps)
    attended = x + attention.apply({"params": params["attn"]}, norm.apply({"params": params["ln_1"]}, x),
                                   positions=positions)
    mlp_input = x if parallel else attended
    expected = attended + mlp.apply({"params": params["mlp"]}, norm.apply({"params": params["ln_2"]}, mlp_input))
    got, _ = block.apply({"params": params}, x, None, positions)
    np.testing.assert_allclose(got, expected, **TOL)


class Positions(nn.Module):
    @nn.compact
    def __call__(self, tokens, positions=None):
        return layers.decoder_positions(self, tokens, positions, max_len=4)


def test_decoder_positions():
    tokens = jnp.zeros((2, 3), jnp.int32)
    variables = init(Positions(), 0, tokens)
    np.testing.assert_array_equal(Positions().apply(variables, tokens), [[0, 1, 2]])
    given = jnp.array([[0, 0, 1], [0, 1, 2]])
    np.testing.assert_array_equal(Positions().apply(variables, tokens, given), given)
    np.testing.assert_array_equal(Positions().apply(variables, tokens, given, mutable=["cache"])[0], given)
    with pytest.raises(ValueError, match="sequence length 5 exceeds the model's max_len 4"):
        Positions().apply(variables, jnp.zeros((1, 5), jnp.int32))
    Positions().apply(variables, jnp.zeros((1, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"decoding \(mutable 'cache'\) needs explicit positions"):
        Positions().apply(variables, tokens, mutable=["cache"])
