"""The train step with accumulation, bf16 and fp16 loss scaling, offloaded optimizer state (CPU, 8 devices).
The same losses on every mesh: tests/t5x_like/test_every_family.py, one table for every family."""
import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from models.neox import NeoXConfig
from partitioning import make_mesh
from t5x_like import optim, step_fns
from t5x_like.experiment import ExperimentSettings, build_experiment
from t5x_like.features import DECODER_LOSS_WEIGHTS
from t5x_like.lm import LossSums
from tests.support.training import SEQ_LEN, STEP_MODEL, TOTAL_STEPS, batches, compiled_after_first_step, run_steps, step_experiment

NEOX_CONFIG = NeoXConfig(vocab_size=256, max_len=SEQ_LEN, num_layers=2, num_heads=8, embed_dim=64, mlp_dim=256,
                         vocab_pad_multiple=1024, dtype="float32")


@pytest.mark.integration
def test_gradient_accumulation_equals_one_big_batch(synthetic_source):
    data = batches(synthetic_source, 3)
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    whole, state_whole = run_steps(mesh, "fsdp_tensor", data)
    accumulated, state_acc = run_steps(mesh, "fsdp_tensor", data, grad_accum_steps=4)
    np.testing.assert_allclose([m["loss"] for m in accumulated], [m["loss"] for m in whole], rtol=1e-5)
    np.testing.assert_allclose([m["grad_norm"] for m in accumulated], [m["grad_norm"] for m in whole], rtol=1e-4)
    # atol covers parameters whose true gradient is zero (the key bias: softmax ignores it), where
    # Adam normalises rounding noise into tiny updates of arbitrary sign.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 state_acc.params, state_whole.params)


@pytest.mark.integration
def test_evaluation_in_microbatches_equals_one_batch_and_the_training_loss(synthetic_source):
    """The eval step splits the batch as GRAD_ACCUM_STEPS does (so it never holds more activations
    than a training microbatch), with sums equal to one pass and Σ nll / Σ w equal to the train step's loss."""
    data = batches(synthetic_source, 1)
    mesh = make_mesh(data=2, tensor=2, devices=jax.devices()[:4])
    sums, temp_bytes = {}, {}
    for accum in (1, 4):
        exp = step_experiment(mesh, "fsdp_tensor", data, grad_accum_steps=accum)
        state = exp.init_state()
        with exp.partitioner.activate():
            batch = exp.global_batch(data[0])
            compiled = exp.eval_step.lower(state.params, batch).compile()
            temp_bytes[accum] = compiled.memory_analysis().temp_size_in_bytes
            sums[accum] = jax.device_get(exp.eval_step(state.params, batch))
            _, metrics = exp.train_step(state, batch)
        assert float(sums[accum]["nll_sum"] / sums[accum]["weight_sum"]) == pytest.approx(float(metrics["loss"]),
                                                                                      rel=1e-5)
    for key in ("nll_sum", "accuracy_sum", "weight_sum"):
        assert float(sums[4][key]) == pytest.approx(float(sums[1][key]), rel=1e-5), key
    assert float(sums[1]["weight_sum"]) > 0
    assert temp_bytes[4] < 0.5 * temp_bytes[1], temp_bytes  # a quarter of the rows at a time


@pytest.mark.integration
def test_bfloat16_compute_tracks_float32(synthetic_source):
    """bf16 compute with fp32 params and loss stays within 2% of fp32 over 6 steps."""
    data = batches(synthetic_source, 6)
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    fp32, _ = run_steps(mesh, "fsdp_tensor", data)
    bf16, _ = run_steps(mesh, "fsdp_tensor", data, config=dataclasses.replace(STEP_MODEL, dtype="bfloat16"))
    np.testing.assert_allclose([m["loss"] for m in bf16], [m["loss"] for m in fp32], rtol=2e-2)


class MegatronGradScaler:
    """Megatron-LM's DynamicGradScaler.update (megatron/core/optimizer/grad_scaler.py), as plain Python:
    DeepSpeed's DynamicLossScaler (consecutive_hysteresis off, its default) moves its scale the same way."""

    def __init__(self, initial_scale, min_scale, growth_interval, hysteresis):
        self.scale, self.min_scale, self.growth_interval, self.hysteresis = (
            initial_scale, min_scale, growth_interval, hysteresis)
        self.growth_tracker, self.hysteresis_tracker = 0, hysteresis

    def update(self, found_inf):
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * 0.5, self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale = self.scale * 2.0


def test_loss_scale_update_rules():
    config = step_fns.LossScaleConfig(initial_scale_power=4, window=2, hysteresis=2, min_scale=4.0)
    scale = step_fns.LossScale.create(config)
    scale = scale.update(np.bool_(False), config)  # first overflow: hysteresis absorbs it
    assert float(scale.scale) == 16.0 and int(scale.hysteresis_left) == 1
    scale = scale.update(np.bool_(False), config)  # second: halve
    assert float(scale.scale) == 8.0
    scale = scale.update(np.bool_(True), config)  # a finite step does not restore the hysteresis
    scale = scale.update(np.bool_(False), config)  # so the next overflow halves at once
    assert float(scale.scale) == 4.0
    for _ in range(3):
        scale = scale.update(np.bool_(False), config)
    assert float(scale.scale) == 4.0  # never below min_scale
    scale = scale.update(np.bool_(True), config)
    scale = scale.update(np.bool_(True), config)  # window of finite steps: double
    assert float(scale.scale) == 8.0 and int(scale.good_steps) == 0 and int(scale.hysteresis_left) == 2


@pytest.mark.parametrize("hysteresis, window", [(1, 3), (2, 4), (3, 2)])
def test_the_loss_scale_moves_as_megatrons_grad_scaler(hysteresis, window):
    """Megatron's --initial-loss-scale 2**32 start, then a random run of overflows and finite steps."""
    config = step_fns.LossScaleConfig(initial_scale_power=32, window=window, hysteresis=hysteresis, min_scale=1.0)
    ours, megatron = step_fns.LossScale.create(config), MegatronGradScaler(2.0 ** 32, 1.0, window, hysteresis)
    overflows = [True] * 20 + list(np.random.default_rng(hysteresis).random(200) < 0.3)
    scales = []
    for overflow in overflows:
        ours = ours.update(np.bool_(not overflow), config)
        megatron.update(overflow)
        scales.append((float(ours.scale), megatron.scale))
    assert [a for a, _ in scales] == [b for _, b in scales]
    assert scales[19][0] == 2.0 ** (32 - 20 + hysteresis - 1)  # one halving per overflow once the hysteresis is used


def test_fp16_overflow_skips_the_step_and_halves_the_scale(synthetic_source):
    """A scale too large for float16 (2**24 times the mean loss) overflows: those steps are skipped and
    the scale halves (hysteresis 1) until it fits, then training goes on."""
    data = batches(synthetic_source, 8)
    loss_scale = step_fns.LossScaleConfig(initial_scale_power=24, window=1000, hysteresis=1)
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    history, _ = run_steps(mesh, "fsdp_tensor", data, config=dataclasses.replace(STEP_MODEL, dtype="float16"),
                     loss_scale=loss_scale)
    skipped = [int(m["skipped"]) for m in history]
    overflows = skipped.index(0)
    assert 1 <= overflows < len(data) and skipped == [1] * overflows + [0] * (len(data) - overflows), skipped
    assert [m["loss_scale"] for m in history[:overflows + 1]] == [2.0 ** (24 - i) for i in range(overflows + 1)]
    # the logged rate is the one applied: skipped steps did not advance optax's schedule
    schedule = optim.make_optimizer(optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=2), TOTAL_STEPS).schedule
    applied = [0] * (overflows + 1) + list(range(1, len(data) - overflows))
    assert [m["learning_rate"] for m in history] == pytest.approx([float(schedule(n)) for n in applied])


def fp16_gradients_finite(exp, state, batch, scale: float, *, mean: bool) -> bool:
    """DeepSpeed's rule, computed here: float16 gradients of scale x (mean, or summed) loss are finite."""
    def loss(params):
        nll, _, weight, _ = exp.lm.loss_sums(params, batch)
        return nll * scale / (weight if mean else 1.0)
    with exp.partitioner.activate():
        grads = jax.jit(jax.grad(loss))(state.params)
    return all(bool(np.isfinite(g).all()) for g in jax.tree.leaves(jax.device_get(grads)))


def test_deepspeeds_fp16_section_skips_what_deepspeed_would(synthetic_source):
    """CPM-Pretrain's ds_config fp16 block (initial_scale_power 16, window 1000, hysteresis 2): the scale
    multiplies the mean loss as DeepSpeed's does, so a step skips exactly when DeepSpeed's would."""
    data = batches(synthetic_source, 3)
    config = dataclasses.replace(STEP_MODEL, dtype="float16")
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    loss_scale = step_fns.LossScaleConfig(initial_scale_power=16, window=1000, hysteresis=2)
    exp = step_experiment(mesh, "fsdp_tensor", data, config=config, loss_scale=loss_scale)
    state = exp.init_state()
    batch = exp.global_batch(data[0])
    deepspeed_skips = not fp16_gradients_finite(exp, state, batch, 2.0 ** 16, mean=True)
    history, _ = run_steps(mesh, "fsdp_tensor", data, config=config, loss_scale=loss_scale)
    assert int(history[0]["skipped"]) == int(deepspeed_skips) == 0
    assert [int(m["skipped"]) for m in history] == [0, 0, 0]
    # what the old rule (scale x summed loss, 128 tokens per step) would have done: overflow
    assert not fp16_gradients_finite(exp, state, batch, 2.0 ** 16, mean=False)


def test_an_update_that_overflows_is_not_applied(synthetic_source):
    """Finite loss and gradients, but a learning rate that sends parameters to infinity: the step is
    skipped like any non-finite step, and says that the update (not the gradients) overflowed."""
    data = batches(synthetic_source, 1)
    mesh = make_mesh(data=1, devices=jax.devices()[:1])
    exp = build_experiment(ExperimentSettings(
        model=STEP_MODEL, mesh=mesh, rules="fsdp_tensor", batch_size=8, feature_lengths={"targets": SEQ_LEN},
        optimizer=optim.OptimizerSettings(learning_rate=3e38, warmup_steps=0, weight_decay=10.0)),  # p - lr*(1 + wd*p) > float32 max
        train_steps=2)
    state = exp.init_state()
    before = jax.device_get((state.params, state.opt_state))
    with exp.partitioner.activate():
        new_state, metrics = exp.train_step(state, exp.global_batch(data[0]))
    assert int(metrics["skipped"]) == 1 and int(metrics["update_finite"]) == 0 and metrics["grad_finite"].all()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get((new_state.params, new_state.opt_state)), before)


def test_a_nonfinite_step_leaves_parameters_unchanged_and_flags_each_gradient(synthetic_source):
    data = batches(synthetic_source, 1)
    data[0] = dict(data[0], **{DECODER_LOSS_WEIGHTS: data[0][DECODER_LOSS_WEIGHTS] * np.float32(np.inf)})
    exp = step_experiment(make_mesh(data=1, devices=jax.devices()[:1]), "fsdp_tensor", data)
    state = exp.init_state()
    before = jax.device_get(state.params)
    with exp.partitioner.activate():
        new_state, metrics = exp.train_step(state, exp.global_batch(data[0]))
    assert int(metrics["skipped"]) == 1 and int(new_state.step) == 1
    assert metrics["grad_finite"].shape == (len(jax.tree.leaves(before)),) and not metrics["grad_finite"].any()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(new_state.params), before)


@pytest.mark.parametrize("config", [STEP_MODEL, NEOX_CONFIG], ids=["gpt2", "neox"])
def test_nothing_recompiles_after_the_first_step(synthetic_source, config):
    compiled, _ = compiled_after_first_step(functools.partial(
        run_steps, make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor", batches(synthetic_source, 5), config=config))
    assert compiled == []


@pytest.mark.integration
def test_offloaded_optimizer_state_lives_in_host_memory_and_trains_the_same(synthetic_source):
    data = batches(synthetic_source, 3)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    want, _ = run_steps(mesh, "fsdp_tensor", data)
    got, state = run_steps(mesh, "fsdp_tensor", data, offload_optimizer_state=True)
    assert {x.sharding.memory_kind for x in jax.tree.leaves(state.opt_state)} == {"pinned_host"}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(state.params)} == {"device"}
    np.testing.assert_allclose([m["loss"] for m in got], [m["loss"] for m in want], rtol=1e-6)


class LinearLM:
    """A stand-in LanguageModel for the step functions (they use only loss_sums, loss_weights and score):
    prediction p = x·w + 0.1·normal(dropout key) per row, nll 0.5·(p - y)² and z-loss z_loss·p², each
    weighted by the row's weight."""

    def loss_weights(self, batch):
        return batch["weights"]

    def predict(self, params, batch, rng):
        noise = 0.0 if rng is None else 0.1 * jax.random.normal(rng, batch["y"].shape)
        return batch["x"] @ params["w"] + noise

    def loss_sums(self, params, batch, rng=None, *, z_loss=0.0, cross_entropy="chunked", loss_chunk_size=256,
                  fp8_state=None):
        pred, w = self.predict(params, batch, rng), batch["weights"]
        return LossSums((w * 0.5 * (pred - batch["y"]) ** 2).sum(), z_loss * (w * pred ** 2).sum(), w.sum(), {})

    def score(self, params, batch):
        pred = self.predict(params, batch, None)
        return {"log_prob": -0.5 * (pred - batch["y"]) ** 2, "correct": (jnp.abs(pred - batch["y"]) < 1).astype(
            jnp.float32)}


def linear_batch(rows=4):
    rng = np.random.default_rng(0)
    return {"x": rng.normal(size=(rows, 3)).astype(np.float32),
            "y": rng.normal(size=rows).astype(np.float32),
            "weights": np.array([1.0, 0.0, 2.0, 1.0][:rows], np.float32)}


def linear_reference_step(w, batch, key, step, accum, z_loss):
    """numpy: the gradient of the batch's mean (nll + z) over its weights, each microbatch (rows i, i + accum,
    ...) with its dropout key fold_in(fold_in(key, step), i) (no fold when accum is 1); (grad, nll, z, weight)."""
    step_key = jax.random.fold_in(key, step)
    grad, nll, z = np.zeros_like(w), 0.0, 0.0
    for i in range(accum):
        rows = slice(i, None, accum)
        x, y, weight = batch["x"][rows], batch["y"][rows], batch["weights"][rows]
        micro_key = step_key if accum == 1 else jax.random.fold_in(step_key, i)
        pred = x @ w + 0.1 * np.asarray(jax.random.normal(micro_key, y.shape))
        grad += ((weight * ((pred - y) + 2 * z_loss * pred))[:, None] * x).sum(0)
        nll += (weight * 0.5 * (pred - y) ** 2).sum()
        z += z_loss * (weight * pred ** 2).sum()
    total = batch["weights"].sum()
    return grad / total, nll, z, total


@pytest.mark.parametrize("accum", [1, 2])
def test_train_step_on_a_linear_model_equals_numpy(accum):
    """Two SGD steps (learning rate 0.5 then 0.25: a linear schedule read at optax's count) of the stand-in
    model: parameters, and every metric, against numpy; float32, 1e-5 relative."""
    schedule = optax.linear_schedule(0.5, 0.0, 4)
    tx = optax.sgd(schedule)
    config = step_fns.StepConfig(grad_accum_steps=accum, z_loss=0.1)
    step = jax.jit(step_fns.make_train_step(LinearLM(), tx, schedule, config))
    w0, key = np.array([0.5, -1.0, 2.0], np.float32), jax.random.PRNGKey(7)
    state = step_fns.TrainState(step=jnp.zeros((), jnp.int32), params={"w": w0}, opt_state=tx.init({"w": w0}),
                               rng=key)
    batch, w = linear_batch(), w0
    for i in range(2):
        state, metrics = step(state, batch)
        grad, nll, z, total = linear_reference_step(w, batch, key, i, accum, 0.1)
        assert float(metrics["learning_rate"]) == pytest.approx(0.5 - 0.125 * i)
        w = w - (0.5 - 0.125 * i) * grad
        np.testing.assert_allclose(state.params["w"], w, rtol=1e-5)
        assert int(state.step) == i + 1 and int(optim.applied_updates(state.opt_state)) == i + 1
        assert float(metrics["loss"]) == pytest.approx(nll / total, rel=1e-5)
        assert float(metrics["z_loss"]) == pytest.approx(z / total, rel=1e-5)
        assert float(metrics["tokens"]) == total
        assert float(metrics["grad_norm"]) == pytest.approx(np.linalg.norm(grad), rel=1e-5)
        assert int(metrics["skipped"]) == 0 and int(metrics["update_finite"]) == 1
        assert metrics["grad_finite"].tolist() == [True]
        assert "loss_scale" not in metrics


def test_a_nonfinite_loss_skips_the_linear_step_and_backs_off_the_loss_scale():
    """fp16-style loss scaling on the stand-in: finite steps equal unscaled ones (1e-5 relative); a step with
    an infinite target changes nothing but the step and the scale (hysteresis 1: halved at once)."""
    schedule = optax.constant_schedule(0.1)
    tx = optax.sgd(schedule)
    scaling = step_fns.LossScaleConfig(initial_scale_power=10, window=3, hysteresis=1, min_scale=1.0)
    w0 = np.array([0.5, -1.0, 2.0], np.float32)
    make = lambda loss_scale: step_fns.TrainState(  # noqa: E731
        step=jnp.zeros((), jnp.int32), params={"w": w0}, opt_state=tx.init({"w": w0}), rng=jax.random.PRNGKey(1),
        loss_scale=loss_scale)
    scaled_step = jax.jit(step_fns.make_train_step(LinearLM(), tx, schedule, step_fns.StepConfig(loss_scale=scaling)))
    plain_step = jax.jit(step_fns.make_train_step(LinearLM(), tx, schedule, step_fns.StepConfig()))
    batch = linear_batch()
    scaled, metrics = scaled_step(make(step_fns.LossScale.create(scaling)), batch)
    plain, _ = plain_step(make(None), batch)
    np.testing.assert_allclose(scaled.params["w"], plain.params["w"], rtol=1e-5)
    assert float(metrics["loss_scale"]) == 1024.0 and plain.loss_scale is None
    bad = dict(batch, y=np.array([np.inf, 0, 0, 0], np.float32))
    after, metrics = scaled_step(scaled, bad)
    np.testing.assert_array_equal(after.params["w"], scaled.params["w"])
    assert int(optim.applied_updates(after.opt_state)) == 1 and int(after.step) == 2
    assert int(metrics["skipped"]) == 1 and metrics["grad_finite"].tolist() == [False]
    assert float(after.loss_scale.scale) == 512.0 and float(metrics["loss_scale"]) == 1024.0


def test_eval_step_sums_in_microbatches_equal_numpy():
    batch = linear_batch()
    params = {"w": np.array([0.5, -1.0, 2.0], np.float32)}
    pred = batch["x"] @ params["w"]
    want = {"nll_sum": (batch["weights"] * 0.5 * (pred - batch["y"]) ** 2).sum(),
            "accuracy_sum": (batch["weights"] * (np.abs(pred - batch["y"]) < 1)).sum(),
            "weight_sum": batch["weights"].sum()}
    for microbatches in (1, 2, 4):
        got = jax.jit(step_fns.make_eval_step(LinearLM(), microbatches))(params, batch)
        assert {k: pytest.approx(float(v), rel=1e-5) for k, v in got.items()} == want, microbatches


class LinearLMWithInit(LinearLM):
    """The stand-in with init_variables: boxed parameters from the key it is given, and a marker FP8 state."""

    def init_variables(self, rng, lengths):
        w = nn.Partitioned(jax.random.normal(rng, (lengths["targets"],)), names=("embed",))
        return {"params": {"w": w}, "_overwrite_with_gradient": {"scale": jnp.ones(1)}}


def test_init_train_state_of_the_linear_model():
    """A fresh state: step 0, parameters from the first half of the key split and the dropout key the
    second, optimizer state that keeps the parameters' logical names, loss scale only when configured."""
    tx = optax.adam(0.1)
    key = jax.random.PRNGKey(3)
    state = step_fns.init_train_state(LinearLMWithInit(), tx, key, {"targets": 3}, None)
    params_key, dropout_key = jax.random.split(key)
    assert state.step.dtype == jnp.int32 and int(state.step) == 0
    np.testing.assert_array_equal(state.params["w"].value, jax.random.normal(params_key, (3,)))
    np.testing.assert_array_equal(jax.random.key_data(state.rng), jax.random.key_data(dropout_key))
    assert state.params["w"].names == ("embed",) and state.opt_state[0].mu["w"].names == ("embed",)
    assert state.loss_scale is None and state.fp8_state == {"scale": jnp.ones(1)}
    scaled = step_fns.init_train_state(LinearLMWithInit(), tx, key, {"targets": 3},
                                      step_fns.LossScaleConfig(initial_scale_power=5, hysteresis=3))
    assert float(scaled.loss_scale.scale) == 32.0 and scaled.loss_scale.scale.dtype == jnp.float32
    assert int(scaled.loss_scale.good_steps) == 0 and int(scaled.loss_scale.hysteresis_left) == 3


class RecordingLinearLM(LinearLM):
    """The stand-in, recording the loss settings each loss_sums call was given."""

    def __init__(self):
        self.seen = []

    def loss_sums(self, params, batch, rng=None, **settings):
        self.seen.append((settings["cross_entropy"], settings["loss_chunk_size"], settings["z_loss"]))
        return super().loss_sums(params, batch, rng, **settings)


def test_train_step_passes_the_loss_settings_to_the_linear_model():
    tx = optax.sgd(optax.constant_schedule(0.1))  # a stateless optimizer has no leaves for leaf_finite to stack
    model = RecordingLinearLM()
    config = step_fns.StepConfig(grad_accum_steps=2, z_loss=0.5, cross_entropy="full_logits", loss_chunk_size=64)
    w0 = np.array([0.5, -1.0, 2.0], np.float32)
    state = step_fns.TrainState(step=jnp.zeros((), jnp.int32), params={"w": w0}, opt_state=tx.init({"w": w0}),
                               rng=jax.random.PRNGKey(0))
    step = step_fns.make_train_step(model, tx, optax.constant_schedule(0.1), config)
    step(state, linear_batch())
    assert set(model.seen) == {("full_logits", 64, 0.5)}
    with pytest.raises(ValueError, match=r"a batch of 3 rows does not split into GRAD_ACCUM_STEPS=2; make the rows "
                                         r"per step a multiple of GRAD_ACCUM_STEPS"):
        step(state, linear_batch(rows=3))


class Fp8LinearLM(LinearLM):
    """The stand-in with a scalar 'FP8 state' s scaling the prediction (s·x·w, no dropout noise): the step
    overwrites s with its gradient, as flax's FP8 ops return a scale's next value as its gradient."""

    def loss_sums(self, params, batch, rng=None, *, z_loss=0.0, fp8_state=None, **settings):
        pred, w = fp8_state["s"] * (batch["x"] @ params["w"]), batch["weights"]
        return LossSums((w * 0.5 * (pred - batch["y"]) ** 2).sum(), jnp.zeros(()), w.sum(), {})


@pytest.mark.parametrize("accum", [1, 2])
def test_fp8_state_of_the_linear_model_takes_its_gradient_maximum_over_microbatches(accum):
    """The next FP8 state is the gradient of the step's mean loss with respect to it (numpy, 1e-5 relative),
    the elementwise maximum over microbatches; a skipped step keeps the old state."""
    tx = optax.sgd(optax.constant_schedule(0.1))
    w0, s0 = np.array([0.5, -1.0, 2.0], np.float32), np.array([1.5], np.float32)
    state = step_fns.TrainState(step=jnp.zeros((), jnp.int32), params={"w": w0}, opt_state=tx.init({"w": w0}),
                               rng=jax.random.PRNGKey(0), fp8_state={"s": s0})
    step = jax.jit(step_fns.make_train_step(Fp8LinearLM(), tx, optax.constant_schedule(0.1),
                                           step_fns.StepConfig(grad_accum_steps=accum)))
    batch = linear_batch()
    new, _ = step(state, batch)
    xw = batch["x"] @ w0
    per_row = batch["weights"] * (s0[0] * xw - batch["y"]) * xw / batch["weights"].sum()
    want = max(per_row[i::accum].sum() for i in range(accum))
    np.testing.assert_allclose(new.fp8_state["s"], [want], rtol=1e-5)
    skipped, metrics = step(new, dict(batch, y=np.array([np.inf, 0, 0, 0], np.float32)))
    assert int(metrics["skipped"]) == 1
    np.testing.assert_array_equal(skipped.fp8_state["s"], new.fp8_state["s"])


def test_a_static_loss_scale_never_changes_but_still_skips_overflows():
    """DeepSpeed's fp16 `loss_scale: 128` (Megatron's --loss-scale 128): the scale is 128 from the start and stays,
    through overflows (which are still skipped) and windows of finite steps; a negative one is refused."""
    config = step_fns.LossScaleConfig(initial_scale_power=16, window=1, hysteresis=1, static_scale=128.0)
    scale = step_fns.LossScale.create(config)
    for finite in (False, False, True, True, False):
        scale = scale.update(np.bool_(finite), config)
        assert float(scale.scale) == 128.0
    with pytest.raises(ValueError, match=r"trainer.LossScaleConfig.static_scale=-1: must be at least 0"):
        step_fns.LossScaleConfig(static_scale=-1.0)
