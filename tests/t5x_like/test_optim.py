"""Optimizers and schedules: Adafactor against transformers' torch Adafactor, T5's rsqrt schedule,
factored statistics replicated under a mesh."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like import optim


def test_rsqrt_schedule_holds_the_peak_then_decays_as_t5x():
    schedule = optim.learning_rate_schedule(peak=0.01, warmup_steps=10_000, total_steps=100_000, decay="rsqrt")
    assert float(schedule(0)) == pytest.approx(0.01)
    assert float(schedule(10_000)) == pytest.approx(0.01)
    # T5X: 1 / sqrt(max(step, 10k)) with base 1.0
    assert float(schedule(40_000)) == pytest.approx(1 / np.sqrt(40_000), rel=1e-6)


def test_rsqrt_needs_warmup():
    with pytest.raises(ValueError, match="WARMUP_STEPS >= 1"):
        optim.learning_rate_schedule(peak=0.01, warmup_steps=0, total_steps=10, decay="rsqrt")


def test_unknown_optimizer_is_named():
    with pytest.raises(ValueError, match="OPTIMIZER='sgd' is unknown"):
        optim.make_optimizer(learning_rate=1e-3, warmup_steps=1, total_steps=10, name="sgd")


def test_one_adafactor_step_equals_transformers_adafactor():
    """Both factor the [128, 256] matrix's second moment into row and column statistics, scale by the
    parameter's RMS and clip the update at RMS 1.0. Tolerance 1e-6 relative (fp32)."""
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    hf_optimization = pytest.importorskip("transformers.optimization", reason="needs the torch extra")
    rng = np.random.default_rng(0)
    start = {"kernel": rng.normal(size=(128, 256)).astype(np.float32),
             "bias": rng.normal(size=(256,)).astype(np.float32)}
    grads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in start.items()}
    opt = optim.make_optimizer(learning_rate=0.01, warmup_steps=10, total_steps=100, name="adafactor",
                               decay="rsqrt", clip_grad_norm=0.0)
    ours, state = dict(start), opt.tx.init(start)
    for _ in range(2):  # two steps: the second moment's decay rate matters from the second on
        updates, state = opt.tx.update(grads, state, ours)
        ours = jax.tree.map(lambda p, u: p + u, ours, updates)

    theirs = {k: torch.nn.Parameter(torch.tensor(v)) for k, v in start.items()}
    torch_opt = hf_optimization.Adafactor(list(theirs.values()), lr=0.01, scale_parameter=True,
                                          relative_step=False, warmup_init=False, decay_rate=-0.8,
                                          clip_threshold=1.0, beta1=None, weight_decay=0.0)
    for _ in range(2):
        for name, p in theirs.items():
            p.grad = torch.tensor(grads[name])
        torch_opt.step()
    for name in ("kernel", "bias"):
        np.testing.assert_allclose(np.asarray(ours[name]), theirs[name].detach().numpy(),
                                   rtol=1e-6, atol=1e-7, err_msg=name)


def test_factored_statistics_are_replicated_and_full_ones_keep_their_names():
    params = {"kernel": nn.Partitioned(jnp.ones((256, 512)), names=("embed", "mlp"))}
    opt = optim.make_optimizer(learning_rate=0.01, warmup_steps=10, total_steps=100, name="adafactor",
                               decay="rsqrt")
    specs = nn.get_partition_spec(jax.eval_shape(lambda p: optim.init_state(opt.tx, p), params))
    factored = specs[1][0]  # chain(clip, adafactor's chain) -> the factored-moments state
    assert factored.v_row["kernel"] == jax.sharding.PartitionSpec(None)
    assert factored.v_col["kernel"] == jax.sharding.PartitionSpec(None)
    adamw = optim.make_optimizer(learning_rate=1e-3, warmup_steps=1, total_steps=10)
    specs = nn.get_partition_spec(jax.eval_shape(lambda p: optim.init_state(adamw.tx, p), params))
    assert jax.sharding.PartitionSpec("embed", "mlp") in jax.tree.leaves(
        specs, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))


def test_weight_decay_mask_covers_matrices_and_optionally_the_vocabulary_tables():
    """minGPT's rule by default (kernels only); Megatron / GPT-NeoX's with decay_embeddings (every weight
    but biases and norm scales). One AdamW step with zero gradients shows which leaves decayed."""
    params = {"embed_in": {"embedding": jnp.ones((8, 4))}, "embed_out": {"embedding": jnp.ones((8, 4))},
              "block": {"fc_kernel": jnp.ones((4, 4)), "fc_bias": jnp.ones(4)},
              "ln_f": {"scale": jnp.ones(4), "bias": jnp.ones(4)}}
    zeros = jax.tree.map(jnp.zeros_like, params)
    for decay_embeddings, decayed in ((False, {"fc_kernel"}), (True, {"fc_kernel", "embed_in", "embed_out"})):
        opt = optim.make_optimizer(learning_rate=0.1, warmup_steps=0, total_steps=10, decay="constant",
                                   weight_decay=0.5, decay_embeddings=decay_embeddings, clip_grad_norm=0.0)
        updates, _ = opt.tx.update(zeros, opt.tx.init(params), params)
        moved = {path[-2 if path[-1].key == "embedding" else -1].key
                 for path, u in jax.tree_util.tree_leaves_with_path(updates) if float(jnp.abs(u).max()) > 0}
        assert moved == decayed, decay_embeddings
        np.testing.assert_allclose(updates["block"]["fc_kernel"], -0.1 * 0.5 * np.ones((4, 4)), rtol=1e-6)
