"""T5 against transformers' T5ForConditionalGeneration: tiny random v1.0 (ReLU, tied) and v1.1
(gated GELU, untied) models give the same logits both ways (fp32, atol 1e-4), greedy KV-cache
decoding equals transformers' generate token for token, packed rows equal unpacked ones, and the
presets have transformers' parameter counts.

Tiny sizes are odd on purpose: d_kv 7 with 3 heads (inner 21) on width 24, 2 encoder and 3 decoder
layers, 8 relative buckets up to distance 20 so that sequences of 26 reach the log-spaced and the
last bucket."""
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
from models.t5 import T5, T5Config
from t5x_like.convert import mapping
from t5x_like.convert import t5 as t5_convert

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from tests.support.hf_models import VERSIONS, hf_and_ours_for, our_config, random_hf_model  # noqa: E402

LOGITS_ATOL = 1e-4  # fp32, logits of magnitude ~1-10
INPUTS, TARGETS = 26, 23


def load_into_hf(hf_model, config, params):
    flat = mapping.flatten(jax.tree.map(np.asarray, params))
    state = {n: torch.from_numpy(np.array(a)) for n, a in mapping.to_hf_tensors(flat, config,
                                                                                  *t5_convert.layout(config))}
    for name, same_as in t5_convert.TIED.items():
        state.setdefault(name, state[same_as])
    hf_model.load_state_dict(state, strict=True)
    return hf_model


def tokens(seed, batch, length, vocab=200):
    return np.random.default_rng(seed).integers(1, vocab, (batch, length))


def hf_logits(model, inputs, targets, attention_mask=None):
    with torch.no_grad():
        return model(input_ids=torch.tensor(inputs), decoder_input_ids=torch.tensor(targets),
                     attention_mask=None if attention_mask is None else torch.tensor(attention_mask)).logits.numpy()


def forward(config, params, inputs, targets, **kwargs):
    fn = jax.jit(lambda p, i, t, kw: T5(config).apply({"params": p}, i, t, **kw))
    return np.asarray(fn(params, inputs, targets, kwargs))


def init(config, inputs=4, targets=3):
    module = T5(config)
    return nn.meta.unbox(jax.jit(module.init)(jax.random.key(0), jnp.zeros((1, inputs), jnp.int32),
                                              jnp.zeros((1, targets), jnp.int32))["params"])


@pytest.fixture(scope="module", params=sorted(VERSIONS))
def hf_and_ours(request):
    return hf_and_ours_for(request.param)


@pytest.fixture(scope="module")
def v1_1():
    """One version for the checks of our own code paths (caches, packing, scan, remat)."""
    return hf_and_ours_for("v1.1")


def test_from_hf_logits_equal_transformers(hf_and_ours):
    """Row 1 has encoder padding (our segment id 0, transformers' attention_mask 0)."""
    model, config, params = hf_and_ours
    inputs, targets = tokens(1, 2, INPUTS), tokens(2, 2, TARGETS)
    mask = np.ones_like(inputs)
    mask[1, 17:] = 0
    ours = forward(config, params, inputs, targets, encoder_segment_ids=jnp.asarray(mask))
    np.testing.assert_allclose(ours[..., :200], hf_logits(model, inputs, targets, mask), atol=LOGITS_ATOL, rtol=0)
    assert (ours[..., 200:] == np.finfo(np.float32).min).all()


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_our_random_model_in_transformers_gives_our_logits(version):
    """Ours -> HF: our freshly initialised parameters, loaded into transformers (strict)."""
    config = our_config(random_hf_model(version))
    params = init(config)
    params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.key(7), x.shape), params)
    hf_model = transformers.T5ForConditionalGeneration(transformers.T5Config(**t5_convert.config_to_hf(config, None)))
    if not config.tie_word_embeddings:
        hf_model.lm_head.weight = torch.nn.Parameter(torch.empty_like(hf_model.shared.weight))
    load_into_hf(hf_model.eval(), config, params)
    inputs, targets = tokens(5, 2, INPUTS), tokens(6, 2, TARGETS)
    np.testing.assert_allclose(forward(config, params, inputs, targets)[..., :200],
                               hf_logits(hf_model, inputs, targets)[..., :200], atol=LOGITS_ATOL, rtol=0)


def test_packed_rows_equal_each_example_alone(v1_1):
    """One row packing (inputs A, targets A) | (inputs B, targets B) gives each example's logits."""
    _, config, params = v1_1
    ia, ib, ta, tb = tokens(7, 1, 9)[0], tokens(8, 1, 13)[0], tokens(9, 1, 6)[0], tokens(10, 1, 12)[0]
    pad_i, pad_t = 3, 2
    seg = lambda a, b, pad: np.concatenate([np.full(len(a), 1), np.full(len(b), 2), np.zeros(pad, int)])[None]
    pos = lambda a, b, pad: np.concatenate([np.arange(len(a)), np.arange(len(b)), np.zeros(pad, int)])[None]
    packed = forward(config, params, np.concatenate([ia, ib, np.zeros(pad_i, int)])[None],
                     np.concatenate([ta, tb, np.zeros(pad_t, int)])[None],
                     encoder_segment_ids=seg(ia, ib, pad_i), decoder_segment_ids=seg(ta, tb, pad_t),
                     encoder_positions=pos(ia, ib, pad_i), decoder_positions=pos(ta, tb, pad_t))
    alone_a = forward(config, params, ia[None], ta[None])
    alone_b = forward(config, params, ib[None], tb[None])
    np.testing.assert_allclose(packed[0, :6, :200], alone_a[0, :, :200], atol=1e-5, rtol=0)
    np.testing.assert_allclose(packed[0, 6:18, :200], alone_b[0, :, :200], atol=1e-5, rtol=0)


def greedy_decode(config, params, inputs, encoder_mask, steps):
    """Greedy KV-cache decoding from the start token 0: encode once, then one token per step."""
    model = T5(config)
    batch = inputs.shape[0]
    encoded = jax.jit(lambda p, i, m: model.apply({"params": p}, i, encoder_segment_ids=m, method=T5.encode))(
        params, inputs, encoder_mask)
    decode = lambda p, c, e, t, m: model.apply({"params": p, "cache": c}, e, t, encoder_segment_ids=m,
                                                method=T5.decode, mutable=["cache"])
    cache = jax.eval_shape(lambda p: model.apply({"params": p}, encoded, jnp.zeros((batch, steps), jnp.int32),
                                                 encoder_segment_ids=encoder_mask, method=T5.decode,
                                                 mutable=["cache"])[1]["cache"], params)
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), nn.meta.unbox(cache))
    first = jax.jit(decode)
    step = jax.jit(lambda p, c, t, m: decode(p, c, None, t, m))
    token = jnp.zeros((batch, 1), jnp.int32)
    logits, variables = first(params, cache, encoded, token, encoder_mask)
    out = []
    for _ in range(steps):
        token = jnp.argmax(logits[:, -1], axis=-1)[:, None].astype(jnp.int32)
        out.append(token)
        logits, variables = step(params, variables["cache"], token, encoder_mask)
    return np.asarray(jnp.concatenate(out, axis=1)), variables["cache"]


def test_greedy_kv_cache_decoding_equals_transformers_generate(hf_and_ours):
    model, config, params = hf_and_ours
    inputs = tokens(11, 2, INPUTS)
    mask = np.ones_like(inputs)
    mask[0, 20:] = 0
    steps = 24  # past the decoder's max_distance 20: every bucket is used
    # transformers' own cache has num_layers (encoder) layers, too few for 3 decoder layers: it
    # decodes without one here (recomputing every step), which gives the same tokens.
    ours, cache = greedy_decode(config, params, jnp.asarray(inputs), jnp.asarray(mask), steps)
    with torch.no_grad():
        theirs = model.generate(input_ids=torch.tensor(inputs), attention_mask=torch.tensor(mask), num_beams=1,
                                do_sample=False, max_new_tokens=steps, min_new_tokens=steps, eos_token_id=None,
                                decoder_start_token_id=0, pad_token_id=0, use_cache=False).numpy()
    np.testing.assert_array_equal(ours, theirs[:, 1:])
    cross = cache["decoder"]["blocks"]["cross_attention"]["cached_key"]
    assert nn.meta.unbox(cross).shape == (3, 2, INPUTS, 3, 7)


def test_cached_logits_equal_full_decoder_logits(v1_1):
    """Teacher-forced: feeding the targets through the cache in chunks gives the full-pass logits."""
    _, config, params = v1_1
    model = T5(config)
    inputs, targets = jnp.asarray(tokens(12, 2, INPUTS)), jnp.asarray(tokens(13, 2, TARGETS))
    want = forward(config, params, inputs, targets)
    encoded = jax.jit(lambda p: model.apply({"params": p}, inputs, method=T5.encode))(params)
    created = jax.eval_shape(lambda p: model.apply({"params": p}, encoded, targets, method=T5.decode,
                                                   mutable=["cache"])[1]["cache"], params)
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), nn.meta.unbox(created))
    decode = jax.jit(lambda p, c, e, t: model.apply({"params": p, "cache": c}, e, t, method=T5.decode,
                                                    mutable=["cache"]))
    got = []
    for start, stop in ((0, 5), (5, 6), (6, TARGETS)):
        logits, variables = decode(params, cache, encoded if start == 0 else None, targets[:, start:stop])
        cache = variables["cache"]
        got.append(logits)
    np.testing.assert_allclose(np.concatenate(got, axis=1)[..., :200], want[..., :200], atol=1e-5, rtol=0)


def test_return_hidden_gives_the_logits_with_the_output_table(v1_1):
    _, config, params = v1_1
    inputs, targets = tokens(14, 2, 8), tokens(15, 2, 5)
    hidden, table = jax.jit(lambda p: T5(config).apply({"params": p}, inputs, targets, return_hidden=True))(params)
    assert table.shape == (config.padded_vocab_size, config.embed_dim)
    np.testing.assert_allclose(np.einsum("bte,ve->btv", hidden, table)[..., :200],
                               forward(config, params, inputs, targets)[..., :200], atol=1e-5, rtol=0)


@pytest.mark.integration
def test_scanned_and_unrolled_layers_compute_the_same(v1_1):
    _, config, params = v1_1
    unrolled_config = dataclasses.replace(config, scan_layers=False)
    unrolled = {k: v for k, v in params.items() if k not in ("encoder", "decoder")}
    for stack, n in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        unrolled[stack] = {k: v for k, v in params[stack].items() if k != "blocks"}
        unrolled[stack].update({f"block_{i}": jax.tree.map(lambda x: x[i], params[stack]["blocks"]) for i in range(n)})
    inputs, targets = tokens(16, 2, 10), tokens(17, 2, 7)
    np.testing.assert_allclose(forward(unrolled_config, unrolled, inputs, targets),
                               forward(config, params, inputs, targets), atol=1e-5)


def test_remat_policies_keep_gradients(v1_1):
    _, config, params = v1_1
    inputs, targets = tokens(18, 2, 10), tokens(19, 2, 7)

    def grad(c):
        return jax.jit(jax.grad(lambda p: T5(c).apply({"params": p}, inputs, targets)[..., :200].mean()))(params)

    want = grad(config)
    for policy in ("full",):
        got = grad(dataclasses.replace(config, remat_policy=policy))
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6, err_msg=policy), want, got)


def test_dropout_is_seeded_and_off_when_deterministic():
    """Deterministic: exactly the model with dropout_rate 0. Not deterministic: dropout changes the
    logits by masks that depend on the seed alone (two separate compilations agree on one seed;
    another seed differs)."""
    sizes = dict(vocab_size=50, num_layers=1, num_decoder_layers=1, num_heads=2, embed_dim=16, d_kv=4, mlp_dim=24)
    config, without_dropout = T5Config(**sizes, dropout_rate=0.3), T5Config(**sizes, dropout_rate=0.0)
    params = init(config)
    inputs, targets = jnp.arange(1, 9)[None], jnp.arange(1, 6)[None]
    without = forward(without_dropout, params, inputs, targets)
    np.testing.assert_allclose(forward(config, params, inputs, targets), without, rtol=0, atol=1e-6)

    def compiled():  # a fresh trace and compilation: a mask drawn from anything but the seed shows up
        fn = jax.jit(lambda key: T5(config).apply({"params": params}, inputs, targets, deterministic=False,
                                                  rngs={"dropout": key}))
        return lambda seed: np.asarray(fn(jax.random.key(seed)))

    first = compiled()(1)
    assert not np.allclose(first, without, atol=1e-3)
    again = compiled()
    np.testing.assert_array_equal(again(1), first)
    assert not np.allclose(again(2), first, atol=1e-3)


def test_relative_position_bucket_equals_transformers():
    relative = torch.arange(-300, 300)
    for bidirectional in (True, False):
        want = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
            relative, bidirectional=bidirectional, num_buckets=32, max_distance=128).numpy()
        got = layers.relative_position_bucket(jnp.arange(-300, 300), bidirectional=bidirectional, num_buckets=32,
                                              max_distance=128)
        np.testing.assert_array_equal(got, want)


def ours_param_count(name):
    config = models.config_from_dict(configs.get_model_config(name).to_dict())
    abstract = jax.eval_shape(lambda: init(config, 4, 3))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(abstract)), config


@pytest.mark.parametrize("name", ["t5_small", "t5_1_1_small"])
def test_parameter_count_equals_transformers(name):
    ours, c = ours_param_count(name)
    hf_config = transformers.T5Config(vocab_size=t5_convert.hf_vocab_rows(c), d_model=c.embed_dim, d_kv=c.d_kv,
                                      d_ff=c.mlp_dim, num_layers=c.num_layers, num_heads=c.num_heads,
                                      feed_forward_proj=c.feed_forward, tie_word_embeddings=c.tie_word_embeddings)
    with torch.device("meta"):
        hf_model = transformers.T5ForConditionalGeneration(hf_config)
    if not c.tie_word_embeddings:  # transformers 5 ties at construction; v1.1 checkpoints untie on load
        hf_model.lm_head.weight = torch.nn.Parameter(torch.empty_like(hf_model.shared.weight))
    assert c.padded_vocab_size == 32128
    assert ours == hf_model.num_parameters()


def test_published_sizes():
    """transformers' counts: t5-base 222,903,552; google/t5-v1_1-base 247,577,856."""
    assert ours_param_count("t5_base")[0] == 222_903_552
    assert ours_param_count("t5_1_1_base")[0] == 247_577_856


def test_flops_and_lengths():
    config = models.config_from_dict(configs.get_model_config("t5_1_1_base").to_dict())
    encoder, decoder, cross_kv = config.matmul_params()
    assert decoder - config.vocab_size * 768 - encoder == 12 * 2 * 768 * 768  # the decoder's q and o per layer
    assert config.train_flops_per_example({"inputs": 512, "targets": 114}) > 6 * 247e6 * 114
    with pytest.raises(ValueError, match="'inputs' and 'targets'"):
        config.check_lengths({"targets": 128})
    config.check_lengths({"inputs": 512, "targets": 114})
    with pytest.raises(ValueError, match="feed_forward 'swiglu'"):
        T5Config(feed_forward="swiglu")


@pytest.mark.integration
def test_sharded_over_data_fsdp_tensor_equals_one_device():
    """data=2 x fsdp=2 x tensor=2 with the fsdp_tensor rules: heads, mlp, vocab and the relative
    bias table split over 'tensor', the same packed-row logits as unsharded (fp32 sums in another order:
    2e-5 on logits up to ~10)."""
    from jax.sharding import PartitionSpec as P

    from partitioning import Partitioner, make_mesh

    config = T5Config(vocab_size=200, num_layers=2, num_decoder_layers=2, num_heads=4, embed_dim=32, d_kv=8,
                      mlp_dim=64, feed_forward="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0)
    params = init(config)
    partitioner = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor")
    with partitioner.activate():
        boxed = jax.eval_shape(T5(config).init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32),
                               jnp.zeros((1, 3), jnp.int32))["params"]
    shardings = partitioner.shardings(nn.get_partition_spec(boxed))
    assert shardings["decoder"]["relpos_bias"]["embedding"].spec == P(None, "tensor")
    assert shardings["encoder"]["blocks"]["mlp"]["gate_kernel"].spec == P("stage", "fsdp", "tensor")
    inputs, targets = tokens(21, 4, 12), tokens(22, 4, 9)
    segments = {"encoder_segment_ids": np.repeat([[1] * 7 + [2] * 5], 4, 0),
                "decoder_segment_ids": np.repeat([[1] * 4 + [2] * 4 + [0]], 4, 0),
                "encoder_positions": np.repeat([list(range(7)) + list(range(5))], 4, 0),
                "decoder_positions": np.repeat([list(range(4)) + list(range(4)) + [0]], 4, 0)}
    want = forward(config, params, inputs, targets, **segments)
    with partitioner.activate():
        sharded = jax.device_put(params, shardings)
        got = forward(config, sharded, inputs, targets, **segments)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("size", configs.t5.SIZES)
def test_every_preset_is_a_valid_config(size):
    config = models.config_from_dict(configs.get_model_config(f"t5_{size}").to_dict())
    assert config.gated == size.startswith(("1_1_", "tiny"))
    assert config.gated != config.tie_word_embeddings
    assert config.summary().startswith(f"t5: {config.num_layers}+{config.num_decoder_layers} layers")
