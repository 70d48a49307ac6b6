"""models/layers/decoder.py: the shared decoder-only model stacks the block class and applies the final norm
its family names, with untied token tables by default and no option of its own; a DecoderBlock that composes
nothing says so; decoding positions are checked. (Each family's own block: tests/models/test_<family>.py.)"""
import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from models.config import DecoderOnlyConfig
from tests.models.layers.references import TOL, init


@dataclasses.dataclass(frozen=True)
class ToyConfig(DecoderOnlyConfig):
    family: str = "toy"
    vocab_size: int = 50
    num_layers: int = 2
    num_heads: int = 4
    embed_dim: int = 16
    mlp_dim: int = 24
    max_len: int = 8
    vocab_pad_multiple: int = 64
    dropout_rate: float = 0.0

    @property
    def input_init_std(self) -> float:
        return 0.1


class ToyBlock(layers.DecoderBlock):
    """A block of one residual ReLU MLP (no attention): the decoder takes whatever block its family names."""

    @nn.compact
    def __call__(self, x, segment_ids, positions):
        return x + layers.MLP(self.config.mlp_dim, "relu", 0.1, 0.1, name="mlp")(x), None


class Toy(layers.DecoderOnly):
    block = ToyBlock
    final_norm = layers.RMSNorm


def shapes(tree):
    return {jax.tree_util.keystr(path): leaf.shape for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def by_hand(config, params, tokens):
    """The toy's logits from the layers: embed_in, each block's MLP residual, RMSNorm, embed_out, padding masked."""
    x = params["embed_in"]["embedding"][tokens]
    mlp = layers.MLP(config.mlp_dim, "relu", 0.1, 0.1)
    for i in range(config.num_layers):
        x = x + mlp.apply({"params": jax.tree.map(lambda p: p[i], params["blocks"]["mlp"])}, x)
    x = layers.RMSNorm(config.layer_norm_eps).apply({"params": params["ln_f"]}, x)
    logits = np.einsum("bte,ve->btv", x, params["embed_out"]["embedding"])
    return np.where(np.arange(logits.shape[-1]) < config.vocab_size, logits, np.finfo(np.float32).min)


def test_the_decoder_stacks_the_family_block_and_final_norm():
    config = ToyConfig()
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 8)), jnp.int32)
    params = nn.meta.unbox(init(Toy(config), 0, tokens)["params"])
    assert sorted(params) == ["blocks", "embed_in", "embed_out", "ln_f"]
    assert shapes(params["blocks"]) == {"['mlp']['fc_kernel']": (2, 16, 24), "['mlp']['proj_kernel']": (2, 24, 16)}
    assert shapes(params["ln_f"]) == {"['scale']": (16,)}  # RMSNorm: no bias
    assert params["embed_in"]["embedding"].shape == params["embed_out"]["embedding"].shape == (64, 16)
    assert np.std(params["embed_out"]["embedding"]) == pytest.approx(0.1, rel=0.1)
    np.testing.assert_allclose(Toy(config).apply({"params": params}, tokens), by_hand(config, params, tokens), **TOL)
    hidden, table = Toy(config).apply({"params": params}, tokens, return_hidden=True)
    np.testing.assert_array_equal(table, params["embed_out"]["embedding"])


def test_the_decoder_only_config_counts_an_ungated_mlp_and_causal_pairs():
    config = ToyConfig()
    e, m = 16, 24
    assert config.mlp_params() == 2 * e * m
    assert config.matmul_params() == 2 * (4 * e * e + 2 * e * m) + 50 * e
    assert config.attention_pairs(8) == 32
    assert config.summary().startswith("toy: 2 layers, width 16, 4 heads x 4, mlp 24, vocab 50")


def test_a_block_that_composes_nothing_says_so():
    class Empty(layers.DecoderBlock):
        pass

    x = jnp.zeros((1, 2, 16))
    with pytest.raises(NotImplementedError, match="Empty must define __call__"):
        init(Empty(ToyConfig(), True), 0, x, None, jnp.zeros((1, 2), jnp.int32))


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
