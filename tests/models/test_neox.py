"""GPT-NeoX against transformers' GPTNeoXForCausalLM (fp32, tiny random models): logits within 1e-4 for
rotary_pct 0.25 and 1.0 with the parallel residual on and off; packed documents; KV-cache decoding
equals recomputation (tests/models/test_decode.py); parameter counts of the Pythia shapes equal transformers'."""
import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs
import models
from models import layers
from models.neox import NeoX, NeoXBlock, NeoXConfig
from tests.models.layers.references import TOL, block_params, param_paths

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.convert import mapping
from t5x_like.convert import neox as convert_neox  # noqa: E402

LOGITS_ATOL = 1e-4  # fp32, logits of magnitude ~10


@pytest.fixture(scope="module")
def hf_model(random_hf_neox):
    """random_hf_neox(rotary_pct, parallel, seed) with every tensor perturbed by 0.2."""
    return lambda rotary_pct, parallel, seed=0: random_hf_neox(0.2, rotary_pct=rotary_pct, parallel=parallel,
                                                               seed=seed)


def ours_from_hf(model, **choices):
    """(config, params) through the converter's name map."""
    config = convert_neox.config_from_hf(model.config.to_dict(), "test", **choices)
    tensors = {n: t.detach().numpy() for n, t in model.state_dict().items()}
    tensors["embed_out.weight"] = tensors.pop("lm_head.weight")  # the saved name (transformers >= 5 renames it)
    flat = mapping.from_hf_tensors(tensors, config, *convert_neox.layout(config), "test")
    return config, jax.tree.map(jnp.asarray, mapping.unflatten(flat))


def apply(config, params, tokens, **kwargs):
    return np.asarray(jax.jit(lambda p, t, kw: NeoX(config).apply({"params": p}, t, **kw))(params, tokens, kwargs))


def hf_logits(model, tokens, **kwargs):
    with torch.no_grad():
        return model(torch.tensor(np.asarray(tokens)), **kwargs).logits.numpy()


@pytest.mark.parametrize("rotary_pct,parallel", [(0.25, True), (1.0, True), (0.25, False), (1.0, False)])
def test_logits_equal_transformers(hf_model, rotary_pct, parallel):
    model = hf_model(rotary_pct, parallel)
    config, params = ours_from_hf(model)
    assert config.rotary_dim == int(16 * rotary_pct) and config.use_parallel_residual == parallel
    tokens = np.random.default_rng(0).integers(0, 301, (2, 19))
    ours = apply(config, params, tokens)
    np.testing.assert_allclose(ours[..., :301], hf_logits(model, tokens), atol=LOGITS_ATOL, rtol=0)
    assert (ours[..., 301:] == np.finfo(np.float32).min).all()


def test_positions_rotate_as_transformers_position_ids(hf_model):
    """Explicit positions (here 5, 8, 11, ...) rotate queries and keys as HF's position_ids do."""
    model = hf_model(0.5, True, seed=1)
    config, params = ours_from_hf(model)
    tokens = np.random.default_rng(1).integers(0, 301, (1, 9))
    positions = 5 + 3 * np.arange(9)[None]
    ours = apply(config, params, tokens, positions=positions)
    theirs = hf_logits(model, tokens, position_ids=torch.tensor(positions))
    np.testing.assert_allclose(ours[..., :301], theirs, atol=LOGITS_ATOL, rtol=0)
    assert not np.allclose(ours, apply(config, params, tokens), atol=1e-3)  # spacing matters, not the offset


def test_packed_documents_do_not_see_each_other(hf_model):
    config, params = ours_from_hf(hf_model(0.25, True))
    doc_a, doc_b = jnp.arange(1, 7), jnp.arange(50, 60)
    packed = jnp.concatenate([doc_a, doc_b])[None]
    segments = jnp.array([[1] * 6 + [2] * 10])
    positions = jnp.concatenate([jnp.arange(6), jnp.arange(10)])[None]
    together = apply(config, params, packed, segment_ids=segments, positions=positions)
    alone = apply(config, params, doc_b[None])
    np.testing.assert_allclose(together[0, 6:, :301], alone[0, :, :301], atol=1e-5)


def test_hidden_states_and_untied_head_give_the_logits(hf_model):
    config, params = ours_from_hf(hf_model(0.25, True))
    tokens = jnp.arange(12)[None] % 301
    hidden, table = jax.jit(lambda p: NeoX(config).apply({"params": p}, tokens, return_hidden=True))(params)
    assert table.shape == (config.padded_vocab_size, 64)
    np.testing.assert_array_equal(table, params["embed_out"]["embedding"])
    assert not np.array_equal(table, params["embed_in"]["embedding"])
    logits = np.einsum("bte,ve->btv", hidden, table)
    np.testing.assert_allclose(logits[..., :301], apply(config, params, tokens)[..., :301], atol=1e-4)


@pytest.mark.parametrize("size", ["70m", "160m"])
def test_parameter_count_equals_transformers(size):
    config = models.config_from_dict(configs.get_model_config(f"pythia_{size}").to_dict())
    boxed = jax.eval_shape(lambda: NeoX(config).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(boxed["params"])))
    ours = total - 2 * (config.padded_vocab_size - config.vocab_size) * config.embed_dim
    hf_config = transformers.GPTNeoXConfig(
        vocab_size=config.vocab_size, hidden_size=config.embed_dim, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, intermediate_size=config.mlp_dim, rotary_pct=0.25)
    with torch.device("meta"):
        theirs = transformers.GPTNeoXForCausalLM(hf_config).num_parameters()
    assert ours == theirs
    published = {"70m": 70_426_624, "160m": 162_322_944}  # Pythia's paper counts, at 50304 rows
    assert ours + 2 * (50304 - 50277) * config.embed_dim == published[size]


def test_init_follows_neox_small_and_wang_init():
    config = NeoXConfig(vocab_size=300, max_len=32, num_layers=8, num_heads=4, embed_dim=128, mlp_dim=512)
    params = nn.meta.unbox(jax.jit(NeoX(config).init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"])
    small, wang = math.sqrt(2 / (5 * 128)), 2 / (8 * math.sqrt(128))
    blocks = params["blocks"]
    assert np.std(blocks["attn"]["query_kernel"]) == pytest.approx(small, rel=0.05)
    assert np.std(blocks["mlp"]["fc_kernel"]) == pytest.approx(small, rel=0.05)
    assert np.std(blocks["attn"]["out_kernel"]) == pytest.approx(wang, rel=0.05)
    assert np.std(blocks["mlp"]["proj_kernel"]) == pytest.approx(wang, rel=0.05)
    assert np.std(params["embed_out"]["embedding"]) == pytest.approx(small, rel=0.05)
    override = dataclasses.replace(config, init_std=0.02)
    assert override.input_init_std == 0.02 and override.output_init_std == wang


def test_a_block_is_a_parallel_or_sequential_residual_of_its_layers():
    """NeoXBlock: x + attn(ln_1 x) + mlp(ln_2 x), or with use_parallel_residual=False h = x + attn(ln_1 x), then
    h + mlp(ln_2 h); rotary attention and an exact-GELU MLP, biases everywhere. The two residuals differ."""
    config = NeoXConfig(vocab_size=300, max_len=32, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                        rotary_pct=0.5)
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 32)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(3, 8), (2, 5))
    params = block_params(NeoXBlock(config, True), x, positions)
    assert param_paths(params) == {
        "ln_1/scale", "ln_1/bias", "ln_2/scale", "ln_2/bias", "mlp/fc_kernel", "mlp/fc_bias", "mlp/proj_kernel",
        "mlp/proj_bias", *(f"attn/{p}_{w}" for p in ("query", "key", "value", "out") for w in ("kernel", "bias"))}
    norm = layers.LayerNorm(config.layer_norm_eps)
    attention = layers.Attention(4, 8, 0.1, 0.1, qkv_bias=True, out_bias=True, rotary=layers.Rotary(4))
    mlp = layers.MLP(64, "gelu", 0.1, 0.1, use_bias=True)
    attended = x + attention.apply({"params": params["attn"]}, norm.apply({"params": params["ln_1"]}, x),
                                   positions=positions)
    expected = {parallel: attended + mlp.apply({"params": params["mlp"]}, norm.apply(
        {"params": params["ln_2"]}, x if parallel else attended)) for parallel in (True, False)}
    for parallel in (True, False):
        block = NeoXBlock(dataclasses.replace(config, use_parallel_residual=parallel), True)
        got, _ = block.apply({"params": params}, x, None, positions)
        np.testing.assert_allclose(got, expected[parallel], **TOL, err_msg=f"parallel={parallel}")
    assert not np.allclose(expected[True], expected[False], atol=1e-3)
    assert ", parallel residual," in config.summary()
    assert "parallel" not in dataclasses.replace(config, use_parallel_residual=False).summary()


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        NeoXConfig(embed_dim=100, num_heads=3)
    with pytest.raises(ValueError, match="rotary_pct 0.1 gives 1 rotary dims"):
        NeoXConfig(embed_dim=64, num_heads=4, rotary_pct=0.1)
    with pytest.raises(ValueError, match="exceeds the model's max_len 2048"):
        NeoXConfig().check_lengths({"targets": 4096})
