"""Optimizers and schedules: Adafactor against transformers' torch Adafactor, T5's rsqrt schedule,
factored statistics replicated under a mesh."""
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
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
        optim.make_optimizer(optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=1, name="sgd"), 10)


def test_one_adafactor_step_equals_transformers_adafactor():
    """Both factor the [128, 256] matrix's second moment into row and column statistics, scale by the
    parameter's RMS and clip the update at RMS 1.0. Tolerance 1e-6 relative (fp32)."""
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    hf_optimization = pytest.importorskip("transformers.optimization", reason="needs the torch extra")
    rng = np.random.default_rng(0)
    start = {"kernel": rng.normal(size=(128, 256)).astype(np.float32),
             "bias": rng.normal(size=(256,)).astype(np.float32)}
    grads = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in start.items()}
    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=0.01, warmup_steps=10, name="adafactor",
                                                       decay="rsqrt", clip_grad_norm=0.0), 100)
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
    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=0.01, warmup_steps=10, name="adafactor",
                                                       decay="rsqrt"), 100)
    specs = nn.get_partition_spec(jax.eval_shape(lambda p: optim.init_state(opt.tx, p), params))
    factored = specs[1][0]  # chain(clip, adafactor's chain) -> the factored-moments state
    assert factored.v_row["kernel"] == jax.sharding.PartitionSpec(None)
    assert factored.v_col["kernel"] == jax.sharding.PartitionSpec(None)
    adamw = optim.make_optimizer(optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=1), 10)
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
        opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=0.1, warmup_steps=0, decay="constant",
                                                           weight_decay=0.5, decay_embeddings=decay_embeddings,
                                                           clip_grad_norm=0.0), 10)
        updates, _ = opt.tx.update(zeros, opt.tx.init(params), params)
        moved = {path[-2 if path[-1].key == "embedding" else -1].key
                 for path, u in jax.tree_util.tree_leaves_with_path(updates) if float(jnp.abs(u).max()) > 0}
        assert moved == decayed, decay_embeddings
        np.testing.assert_allclose(updates["block"]["fc_kernel"], -0.1 * 0.5 * np.ones((4, 4)), rtol=1e-6)


@pytest.mark.parametrize("setting, value, name", [
    ("learning_rate", -1.0, "LEARNING_RATE"), ("warmup_steps", -1, "WARMUP_STEPS"),
    ("total_steps", -1, "TRAIN_STEPS"),
    ("min_learning_rate_ratio", 1.5, "optim.make_optimizer.min_learning_rate_ratio"),
    ("weight_decay", -0.1, "optim.make_optimizer.weight_decay"),
    ("clip_grad_norm", -1.0, "optim.make_optimizer.clip_grad_norm"), ("b1", 1.5, "optim.make_optimizer.b1"),
    ("b2", 1.01, "optim.make_optimizer.b2"), ("adafactor_decay_rate", 2.0, "optim.make_optimizer.adafactor_decay_rate"),
    ("eps", 0.0, "optim.make_optimizer.eps")])
def test_each_bad_setting_is_refused_naming_it(setting, value, name):
    settings = {"learning_rate": 1e-3, "warmup_steps": 1, "total_steps": 10, setting: value}
    total_steps = settings.pop("total_steps")
    with pytest.raises(ValueError) as raised:
        optim.make_optimizer(optim.OptimizerSettings(**settings), total_steps)
    assert str(raised.value).startswith(f"{name}={value:g}: must be "), str(raised.value)


def test_unknown_decay_and_too_long_warmup_are_named():
    with pytest.raises(ValueError, match="learning-rate decay 'step' is unknown; choose one of"):
        optim.learning_rate_schedule(peak=1.0, warmup_steps=1, total_steps=10, decay="step")
    with pytest.raises(ValueError, match="WARMUP_STEPS=10 must be smaller than TRAIN_STEPS=10 for 'cosine' decay"):
        optim.learning_rate_schedule(peak=1.0, warmup_steps=10, total_steps=10)
    constant = optim.learning_rate_schedule(peak=2.0, warmup_steps=10, total_steps=10, decay="constant")
    assert [float(constant(s)) for s in (0, 5, 10, 50)] == pytest.approx([0.0, 1.0, 2.0, 2.0], rel=1e-6)


@pytest.mark.parametrize("decay", ["cosine", "linear", "constant"])
def test_schedules_follow_their_formulas(decay):
    """Linear warmup to the peak over 4 steps, then (over the 16 decay steps) cosine or linear decay to
    min_ratio * peak, or constant; numpy formulas, 1e-6 relative."""
    peak, warmup, total, ratio = 3e-3, 4, 20, 0.2
    schedule = optim.learning_rate_schedule(peak=peak, warmup_steps=warmup, total_steps=total, decay=decay,
                                            min_ratio=ratio)
    steps = np.arange(0, 26)
    progress = np.clip((steps - warmup) / (total - warmup), 0, 1)
    after = {"cosine": peak * (ratio + (1 - ratio) * 0.5 * (1 + np.cos(np.pi * progress))),
             "linear": peak + (ratio * peak - peak) * progress,
             "constant": np.full(steps.shape, peak)}[decay]
    expected = np.where(steps < warmup, peak * steps / warmup, after)
    np.testing.assert_allclose([float(schedule(s)) for s in steps], expected, rtol=1e-6, atol=1e-12)


def test_one_decay_step_reaches_the_minimum():
    schedule = optim.learning_rate_schedule(peak=1.0, warmup_steps=3, total_steps=4, min_ratio=0.1)
    assert float(schedule(3)) == pytest.approx(1.0) and float(schedule(4)) == pytest.approx(0.1, rel=1e-6)
    no_warmup = optim.learning_rate_schedule(peak=1.0, warmup_steps=0, total_steps=4, decay="linear", min_ratio=0.0)
    assert [float(no_warmup(s)) for s in range(5)] == pytest.approx([1.0, 0.75, 0.5, 0.25, 0.0], abs=1e-7)


@pytest.mark.parametrize("clip", [0.0, 0.5])
def test_adamw_steps_equal_optaxs_with_and_without_clipping(clip):
    """Two AdamW steps with clipping at global norm `clip` (0: none) equal optax's clip_by_global_norm +
    adamw with the same schedule and mask (eps 0.5 so clipping changes the update); 1e-6 relative."""
    rng = np.random.default_rng(0)
    params = {"fc_kernel": rng.normal(size=(3, 4)).astype(np.float32), "fc_bias": rng.normal(size=4).astype(np.float32)}
    grads = [jax.tree.map(lambda p: 10 * rng.normal(size=p.shape).astype(np.float32), params) for _ in range(2)]
    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=0.1, warmup_steps=0, b1=0.8, b2=0.9, eps=0.5,
                                                       weight_decay=0.3, clip_grad_norm=clip), 10)
    mask = {"fc_kernel": True, "fc_bias": False}
    reference = optax.chain(optax.clip_by_global_norm(clip) if clip else optax.identity(),
                            optax.adamw(opt.schedule, b1=0.8, b2=0.9, eps=0.5, weight_decay=0.3, mask=mask))
    ours, theirs = (params, opt.tx.init(params)), (params, reference.init(params))
    for g in grads:
        for (p, s), tx, side in ((ours, opt.tx, 0), (theirs, reference, 1)):
            updates, s = tx.update(g, s, p)
            result = (optax.apply_updates(p, updates), s)
            ours, theirs = (result, theirs) if side == 0 else (ours, result)
    for name in params:
        np.testing.assert_allclose(ours[0][name], theirs[0][name], rtol=1e-6, err_msg=name)
    assert int(optim.applied_updates(ours[1])) == 2
    unclipped = optim.make_optimizer(optim.OptimizerSettings(learning_rate=0.1, warmup_steps=0, b1=0.8, b2=0.9,
                                                             eps=0.5, weight_decay=0.3,
                                                             clip_grad_norm=0.0 if clip else 0.5), 10)
    first, _ = unclipped.tx.update(grads[0], unclipped.tx.init(params), params)
    mine, _ = opt.tx.update(grads[0], opt.tx.init(params), params)
    assert not np.allclose(first["fc_bias"], mine["fc_bias"])  # clipping is on exactly when clip > 0


def test_applied_updates_needs_a_schedule():
    message = r"^the optimizer state holds no learning-rate schedule \(optax.ScaleByScheduleState\)$"
    with pytest.raises(ValueError, match=message):
        optim.applied_updates(optax.sgd(0.1).init({"w": jnp.ones(2)}))


def test_adafactor_is_per_layer_so_scanned_and_unrolled_layers_update_alike():
    """A scanned stack's [layers, ...] leaves get the updates and the state (stacked) of the same layers
    unrolled, bit for bit: factored moments, update clipping and parameter scale per layer, one count.
    One layer with 100x larger gradients shows it: optax's Adafactor over the whole stacked array clips
    and scales every layer by that layer's statistics too."""
    rng = np.random.default_rng(0)
    layers = 3
    stacked = {"blocks": {"kernel": rng.normal(size=(layers, 128, 256)).astype(np.float32),
                          "bias": rng.normal(size=(layers, 256)).astype(np.float32)},
               "embedding": rng.normal(size=(200, 64)).astype(np.float32)}
    grads = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), stacked)
    grads["blocks"]["kernel"][1] *= 100

    def unroll(tree):
        return {"embedding": tree["embedding"],
                **{f"block_{i}": jax.tree.map(lambda x: x[i], tree["blocks"]) for i in range(layers)}}

    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=0.01, warmup_steps=10, name="adafactor",
                                                       decay="rsqrt", clip_grad_norm=0.0), 100)
    runs = []
    for params, g in ((stacked, grads), (unroll(stacked), unroll(grads))):
        state = opt.tx.init(params)
        for _ in range(3):
            updates, state = jax.jit(opt.tx.update)(g, state, params)
            params = jax.tree.map(lambda p, u: p + u, params, updates)
        runs.append((params, state))
    (scanned, scanned_state), (unrolled, unrolled_state) = runs
    jax.tree.map(np.testing.assert_array_equal, unroll(scanned), unrolled)
    factored = scanned_state[1][0]
    assert factored.count.shape == () and factored.v_row["blocks"]["kernel"].shape == (layers, 128)
    assert int(optim.applied_updates(scanned_state)) == int(optim.applied_updates(unrolled_state)) == 3
    for name in ("v_row", "v_col", "v"):
        jax.tree.map(np.testing.assert_array_equal, unroll(getattr(factored, name)),
                     getattr(unrolled_state[1][0], name))

    whole = optax.adafactor(0.01, clipping_threshold=1.0, multiply_by_parameter_scale=True)
    whole_updates, _ = whole.update(grads, whole.init(stacked), stacked)
    layer_updates, _ = whole.update(unroll(grads), whole.init(unroll(stacked)), unroll(stacked))
    assert not np.allclose(unroll(whole_updates)["block_0"]["kernel"], layer_updates["block_0"]["kernel"],
                           rtol=1e-3)


def test_adafactor_decay_rate_is_used():
    """adafactor_decay_rate reaches optax's Adafactor: two steps equal optax.adafactor(decay_rate=0.5) with T5X's
    settings; 1e-6 relative."""
    rng = np.random.default_rng(2)
    params = {"kernel": rng.normal(size=(130, 140)).astype(np.float32)}
    grads = [{"kernel": rng.normal(size=(130, 140)).astype(np.float32)} for _ in range(2)]
    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=0.01, warmup_steps=10, name="adafactor",
                                                       decay="rsqrt", clip_grad_norm=0.0, adafactor_decay_rate=0.5),
                               100)
    reference = optax.adafactor(opt.schedule, decay_rate=0.5, clipping_threshold=1.0, multiply_by_parameter_scale=True,
                                factored=True)
    ours, theirs = opt.tx.init(params), reference.init(params)
    for g in grads:
        mine, ours = opt.tx.update(g, ours, params)
        want, theirs = reference.update(g, theirs, params)
    np.testing.assert_allclose(mine["kernel"], want["kernel"], rtol=1e-6)


def megatron_lr(step: int, *, max_lr: float, min_lr: float, warmup: int, decay_steps: int, style: str) -> float:
    """Megatron-LM's OptimizerParamScheduler.get_lr (megatron/core/optimizer_param_scheduler.py), written out:
    a linear ramp from 0, then cosine or linear from max_lr down to min_lr at decay_steps, min_lr after."""
    if warmup > 0 and step <= warmup:
        return max_lr * step / warmup
    if step > decay_steps:
        return min_lr
    ratio = (step - warmup) / (decay_steps - warmup)
    coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0) if style == "cosine" else 1.0 - ratio
    return min_lr + coeff * (max_lr - min_lr)


@pytest.mark.parametrize("style", ["cosine", "linear"])
def test_megatron_min_lr_schedule_with_fractional_warmup_and_shorter_decay(style):
    """The Megatron GPT-2 tutorial's schedule, scaled down: 500 iterations, decay over 320 (--lr-decay-iters),
    warmup .01 of the decay length, --min-lr 1e-5 under --lr 1.5e-4; 1e-6 relative at every step."""
    schedule = optim.learning_rate_schedule(peak=1.5e-4, warmup_steps=0.01, total_steps=500, decay=style,
                                            decay_steps=320, minimum=1e-5)
    expected = [megatron_lr(s, max_lr=1.5e-4, min_lr=1e-5, warmup=round(0.01 * 320), decay_steps=320, style=style)
                for s in range(501)]
    np.testing.assert_allclose([float(schedule(s)) for s in range(501)], expected, rtol=1e-6, atol=1e-12)
    fraction = optim.learning_rate_schedule(peak=1.0, warmup_steps=0.1, total_steps=1000, decay_steps=0.5)
    assert float(fraction(10)) == pytest.approx(0.2) and float(fraction(50)) == pytest.approx(1.0)
    assert float(fraction(500)) == pytest.approx(0.1) and float(fraction(900)) == pytest.approx(0.1)


def test_noam_ramps_then_decays_as_the_inverse_square_root():
    """Vaswani et al.: d^-0.5 * min(step^-0.5, step * warmup^-1.5), scaled so that its peak (at the end of the
    warmup) is LEARNING_RATE; a min_learning_rate floors it."""
    warmup, peak = 40, 2e-3
    schedule = optim.learning_rate_schedule(peak=peak, warmup_steps=warmup, total_steps=1000, decay="noam")
    steps = np.arange(1, 1001)
    noam = np.minimum(steps ** -0.5, steps * warmup ** -1.5)
    np.testing.assert_allclose([float(schedule(s)) for s in steps], peak * noam / noam.max(), rtol=1e-5)
    assert float(schedule(0)) == 0.0
    floored = optim.learning_rate_schedule(peak=peak, warmup_steps=warmup, total_steps=1000, decay="noam",
                                           minimum=5e-4)
    assert float(floored(1000)) == pytest.approx(5e-4) and float(floored(50)) == pytest.approx(float(schedule(50)))


@pytest.mark.parametrize("settings, message", [
    ({"warmup_steps": 1.5}, r"WARMUP_STEPS=1.5: give whole steps \(an integer, no decimal point\) or a fraction"),
    ({"warmup_steps": 500, "decay_steps": 0.4},
     "WARMUP_STEPS=500 must be smaller than optim.make_optimizer.decay_steps=400 for 'cosine' decay"),
    ({"warmup_steps": 0, "decay": "noam"}, r"the 'noam' schedule decays as sqrt\(WARMUP_STEPS / step\)"),
    ({"warmup_steps": 1, "minimum": 2.0}, "optim.make_optimizer.min_learning_rate=2: must be at least 0 and at "
                                          "most 1; at most LEARNING_RATE"),
    ({"warmup_steps": 1, "decay_steps": -3}, "optim.make_optimizer.decay_steps=-3: must be >= 0; or a fraction of TRAIN_STEPS")])
def test_bad_schedule_lengths_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        optim.learning_rate_schedule(peak=1.0, total_steps=1000, **settings)


SCHEDULE_WORDS = [
    (dict(warmup_steps=0.1), "warmup 100 steps (WARMUP_STEPS = 0.1 of 1000), cosine decay to step 1000, floor 6e-05 "
                             "(min_learning_rate_ratio 0.1 x LEARNING_RATE; min_learning_rate unset)"),
    (dict(warmup_steps=0.1, min_learning_rate=1e-5),
     "warmup 100 steps (WARMUP_STEPS = 0.1 of 1000), cosine decay to step 1000, floor 1e-05 (min_learning_rate, "
     "absolute; min_learning_rate_ratio is ignored)"),
    (dict(warmup_steps=0, decay="linear", min_learning_rate_ratio=0.0),
     "no warmup, linear decay to step 1000, floor 0 (min_learning_rate_ratio 0 x LEARNING_RATE; min_learning_rate "
     "unset)"),
    (dict(warmup_steps=0.01, decay_steps=0.5),
     "warmup 5 steps (WARMUP_STEPS = 0.01 of 500), cosine decay to step 500 (make_optimizer.decay_steps = 0.5 of "
     "TRAIN_STEPS 1000), floor 6e-05 (min_learning_rate_ratio 0.1 x LEARNING_RATE; min_learning_rate unset)"),
    (dict(warmup_steps=10, decay="constant", min_learning_rate=1e-5),
     "warmup 10 steps, then constant at LEARNING_RATE 0.0006 (no decay: min_learning_rate and "
     "min_learning_rate_ratio are unused)"),
    (dict(warmup_steps=100, decay="rsqrt"),
     "rsqrt: LEARNING_RATE 0.0006 held for 100 steps, then LEARNING_RATE x sqrt(100 / step), 0.00019 at step 1000 "
     "(TRAIN_STEPS); no floor (min_learning_rate unset; min_learning_rate_ratio is unused by 'rsqrt')"),
    (dict(warmup_steps=0.1, decay="noam", min_learning_rate=2e-4),
     "noam: warmup to LEARNING_RATE 0.0006 over 100 steps (WARMUP_STEPS = 0.1 of 1000), then LEARNING_RATE x "
     "sqrt(100 / step), 0.0002 at step 1000 (TRAIN_STEPS); floor 0.0002 (min_learning_rate)"),
]


@pytest.mark.parametrize("settings, words", SCHEDULE_WORDS)
def test_the_schedule_is_described_as_the_optimizer_resolves_it(settings, words):
    """--print_config's `# Schedule:` line: fractions in steps, which floor applies, and each kind's own shape."""
    assert optim.describe_schedule(optim.OptimizerSettings(learning_rate=6e-4, **settings), 1000) == words


@pytest.mark.parametrize("settings", [dict(warmup_steps=0.1), dict(warmup_steps=0.1, min_learning_rate=1e-5),
                                      dict(warmup_steps=30, decay="linear", min_learning_rate_ratio=0.5)])
def test_the_described_warmup_and_floor_are_where_the_schedule_has_them(settings):
    """The numbers the description gives are the schedule's: the peak at the end of the warmup, the floor at the
    end of the decay."""
    arguments = dict(peak=6e-4, total_steps=1000, warmup_steps=settings["warmup_steps"],
                     decay=settings.get("decay", "cosine"), min_ratio=settings.get("min_learning_rate_ratio", 0.1),
                     minimum=settings.get("min_learning_rate"))
    steps, schedule = optim.resolve_schedule(**arguments), optim.learning_rate_schedule(**arguments)
    words = optim.describe_schedule(optim.OptimizerSettings(learning_rate=6e-4, **settings), 1000)
    assert f"warmup {steps.warmup} steps" in words and f"floor {steps.floor:g} " in words
    assert float(schedule(steps.warmup)) == pytest.approx(6e-4)
    assert float(schedule(steps.decay_end)) == pytest.approx(steps.floor)
