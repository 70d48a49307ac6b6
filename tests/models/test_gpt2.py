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
from models.gpt2 import GPT2, GPT2Block, GPT2Config
from tests.models.layers.references import TOL, block_params, param_paths

SMALL = GPT2Config(vocab_size=300, max_len=32, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64,
                   dropout_rate=0.0, attention_dropout_rate=0.0)


def init(config, length=16):
    params = jax.jit(GPT2(config).init)(jax.random.PRNGKey(0), jnp.zeros((1, length), jnp.int32))["params"]
    return nn.meta.unbox(params)


def apply(config, params, tokens, **kwargs):
    """A jitted forward pass (eager Flax is slow op by op)."""
    fn = jax.jit(lambda p, t, kw: GPT2(config).apply({"params": p}, t, **kw))
    return fn(params, tokens, kwargs)


def ours_param_count(size):
    config = models.config_from_dict(configs.get_model_config(f"gpt2_{size}").to_dict())
    abstract = jax.eval_shape(lambda: init(config, 8))
    total = sum(math.prod(x.shape) for x in jax.tree.leaves(abstract))
    return total - (config.padded_vocab_size - config.vocab_size) * config.embed_dim, config


@pytest.mark.parametrize("size", ["tiny", "small"])
def test_parameter_count_equals_transformers(size):
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (transformers)")
    ours, c = ours_param_count(size)
    hf_config = transformers.GPT2Config(vocab_size=c.vocab_size, n_positions=c.max_len, n_embd=c.embed_dim,
                                        n_layer=c.num_layers, n_head=c.num_heads)
    hf = transformers.GPT2LMHeadModel(hf_config)
    assert ours == hf.num_parameters()


def test_published_sizes():
    assert ours_param_count("small")[0] == 124_439_808
    assert ours_param_count("xl")[0] == 1_557_611_200


def test_padded_vocabulary_takes_no_probability_mass():
    params = init(SMALL)
    logits = apply(SMALL, params, jnp.arange(16)[None] % 300)
    assert logits.shape[-1] == SMALL.padded_vocab_size == 384
    probs = jax.nn.softmax(logits, axis=-1)
    assert float(probs[..., 300:].max()) == 0.0
    np.testing.assert_allclose(probs[..., :300].sum(-1), 1.0, rtol=1e-5)


def test_residual_projections_use_scaled_init():
    config = dataclasses.replace(SMALL, num_layers=8, embed_dim=128, mlp_dim=512)
    blocks = init(config)["blocks"]
    expected = 0.02 / math.sqrt(2 * 8)
    assert np.std(blocks["mlp"]["proj_kernel"]) == pytest.approx(expected, rel=0.05)
    assert np.std(blocks["attn"]["out_kernel"]) == pytest.approx(expected, rel=0.05)
    assert np.std(blocks["mlp"]["fc_kernel"]) == pytest.approx(0.02, rel=0.05)


def test_scanned_and_unrolled_layers_compute_the_same():
    scanned = init(SMALL)
    unrolled_config = dataclasses.replace(SMALL, scan_layers=False)
    unrolled = {k: v for k, v in scanned.items() if k != "blocks"}
    for i in range(SMALL.num_layers):
        unrolled[f"block_{i}"] = jax.tree.map(lambda x: x[i], scanned["blocks"])
    tokens = jnp.arange(32).reshape(2, 16) * 7 % 300
    a = apply(SMALL, scanned, tokens)
    b = apply(unrolled_config, unrolled, tokens)
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_block_is_layer_norms_biased_attention_and_a_gelu_tanh_mlp_in_sequence():
    """GPT2Block: h = x + attn(ln_1 x), then h + mlp(ln_2 h), every projection with its bias, GELU(tanh)."""
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 32)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
    params = block_params(GPT2Block(SMALL, True), x, positions)
    assert param_paths(params) == {
        "ln_1/scale", "ln_1/bias", "ln_2/scale", "ln_2/bias", "mlp/fc_kernel", "mlp/fc_bias", "mlp/proj_kernel",
        "mlp/proj_bias", *(f"attn/{p}_{w}" for p in ("query", "key", "value", "out") for w in ("kernel", "bias"))}
    norm = layers.LayerNorm(SMALL.layer_norm_eps)
    attention = layers.Attention(4, 8, 0.02, 0.02, qkv_bias=True, out_bias=True)
    mlp = layers.MLP(64, "gelu_tanh", 0.02, 0.02, use_bias=True)
    h = x + attention.apply({"params": params["attn"]}, norm.apply({"params": params["ln_1"]}, x))
    expected = h + mlp.apply({"params": params["mlp"]}, norm.apply({"params": params["ln_2"]}, h))
    got, _ = GPT2Block(SMALL, True).apply({"params": params}, x, None, positions)
    np.testing.assert_allclose(got, expected, **TOL)


def test_remat_policies_keep_gradients():
    params = init(SMALL)
    tokens = jnp.arange(32).reshape(2, 16) * 5 % 300

    def grad(config):
        return jax.jit(jax.grad(lambda p: GPT2(config).apply({"params": p}, tokens)[..., :300].mean()))(params)

    want = grad(SMALL)
    for policy in ("full", "minimal", "save_dots", "save_qkv_proj", "minimal_offloaded"):
        got = grad(dataclasses.replace(SMALL, remat_policy=policy))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, err_msg=policy), want, got)



def test_unknown_remat_policy():
    with pytest.raises(ValueError, match="remat policy 'some'"):
        init(dataclasses.replace(SMALL, remat_policy="some"))


def test_packed_documents_do_not_see_each_other():
    """A row packing docs A|B gives B the same logits as B alone (positions restart)."""
    params = init(SMALL)
    doc_a, doc_b = jnp.arange(1, 7), jnp.arange(50, 60)
    packed = jnp.concatenate([doc_a, doc_b])[None]
    segments = jnp.array([[1] * 6 + [2] * 10])
    positions = jnp.concatenate([jnp.arange(6), jnp.arange(10)])[None]
    together = apply(SMALL, params, packed, segment_ids=segments, positions=positions)
    alone = apply(SMALL, params, doc_b[None])
    np.testing.assert_allclose(together[0, 6:, :300], alone[0, :, :300], atol=1e-5)


def dropout_run(config, params, tokens):
    """seed -> logits with dropout on; a fresh trace and compilation per call of dropout_run, so that a
    mask drawn from anything but the seed (host randomness at trace time included) shows up."""
    fn = jax.jit(lambda p, t, key: GPT2(config).apply({"params": p}, t, deterministic=False, rngs={"dropout": key}))
    return lambda seed: np.asarray(fn(params, tokens, jax.random.PRNGKey(seed)))


def test_dropout_is_seeded_and_off_when_deterministic():
    """Deterministic: exactly the model with dropout rates 0. Not deterministic: the residual/embedding
    and the attention dropout each change the logits, by masks that depend on the seed alone (two
    separate compilations agree on one seed; another seed differs)."""
    params = init(SMALL)
    tokens = jnp.arange(16)[None] * 7 % 300
    without = np.asarray(apply(SMALL, params, tokens))
    config = dataclasses.replace(SMALL, dropout_rate=0.5, attention_dropout_rate=0.5)
    np.testing.assert_allclose(apply(config, params, tokens), without, rtol=0, atol=1e-6)
    first = dropout_run(config, params, tokens)(1)
    assert not np.allclose(first, without, atol=1e-3)
    again = dropout_run(config, params, tokens)
    np.testing.assert_array_equal(again(1), first)
    assert not np.allclose(again(2), first, atol=1e-3)
    for rates in [(0.5, 0.0), (0.0, 0.5)]:
        only = dataclasses.replace(SMALL, dropout_rate=rates[0], attention_dropout_rate=rates[1])
        assert not np.allclose(dropout_run(only, params, tokens)(1), without, atol=1e-3), rates


def test_config_errors_name_the_fix():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        GPT2Config(embed_dim=100, num_heads=3)
    with pytest.raises(ValueError, match="unknown fields"):
        models.config_from_dict({"family": "gpt2", "n_embd": 3})
    with pytest.raises(ValueError, match="family"):
        models.config_from_dict({"family": "gemma"})
    with pytest.raises(ValueError, match="gpt2_tiny"):
        configs.get_model_config("gpt3_small")


def test_tied_logits_backward_runs_in_the_operand_dtype():
    """The custom VJP matches autodiff in fp32 exactly; in bf16 its matmuls take bf16 operands (no
    fp32/TF32 promotion) and agree with fp32 autodiff to bf16 rounding."""
    from models.layers import tied_logits

    kx, ke, kg = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, (2, 8, 32), jnp.float32)
    emb = jax.random.normal(ke, (128, 32), jnp.float32) * 0.1
    g = jax.random.normal(kg, (2, 8, 128), jnp.float32)
    plain = lambda a, b: jnp.einsum("bte,ve->btv", a, b, preferred_element_type=jnp.float32)  # noqa: E731
    want = jax.vjp(plain, x, emb)[1](g)
    got = jax.vjp(tied_logits, x, emb)[1](g)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6), got, want)
    bf = lambda a: a.astype(jnp.bfloat16)  # noqa: E731
    hlo = jax.jit(lambda a, b: jax.vjp(tied_logits, a, b)[1](g)).lower(bf(x), bf(emb)).as_text()
    dots = [line for line in hlo.splitlines() if "dot_general" in line]
    assert len(dots) == 2 and all("xbf16>, tensor" in d for d in dots), dots
    got_bf16 = jax.vjp(tied_logits, bf(x), bf(emb))[1](g)
    for a, b in zip(got_bf16, want):
        np.testing.assert_allclose(np.asarray(a, np.float32), b, rtol=0.05, atol=0.05)
