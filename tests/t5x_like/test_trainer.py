"""The train step on different meshes, with accumulation, bf16 and fp16 loss scaling (CPU, 8 devices)."""
import dataclasses
import logging

import jax
import numpy as np
import pytest

from models.gpt2 import GPT2Config
from models.neox import NeoXConfig
from partitioning import make_mesh
from t5x_like import optim, trainer
from t5x_like.experiment import build_experiment
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS

SEQ_LEN = 16
# 8 heads and a vocabulary padded to 1024 so every mesh below divides the same parameters.
CONFIG = GPT2Config(vocab_size=256, max_len=SEQ_LEN, num_layers=2, num_heads=8, embed_dim=64, mlp_dim=256,
                    dropout_rate=0.0, attention_dropout_rate=0.0, vocab_pad_multiple=1024, dtype="float32")
NEOX_CONFIG = NeoXConfig(vocab_size=256, max_len=SEQ_LEN, num_layers=2, num_heads=8, embed_dim=64, mlp_dim=256,
                         vocab_pad_multiple=1024, dtype="float32")


def batches(source_cls, count, batch_size=8):
    source = source_cls("train", batch_size=batch_size, feature_lengths={"targets": SEQ_LEN}, seed=3, shard_index=0,
                        shard_count=1)
    return [next(source) for _ in range(count)]


def experiment(mesh, rules, data, *, config=CONFIG, feature_lengths=None, **settings):
    optimizer = optim.make_optimizer(learning_rate=3e-3, warmup_steps=2, total_steps=max(len(data), 3))
    return build_experiment(model=config, mesh=mesh, rules=rules, optimizer=optimizer, batch_size=len(
        data[0][DECODER_INPUT_TOKENS]), feature_lengths=feature_lengths or {"targets": SEQ_LEN}, **settings)


def run(mesh, rules, data, *, config=CONFIG, steps_between=None, **settings):
    """Train on `data` batches; returns per-step metrics and the final state."""
    exp = experiment(mesh, rules, data, config=config, **settings)
    state = exp.init_state()
    history = []
    with exp.partitioner.activate():
        for i, batch in enumerate(data):
            if steps_between:
                steps_between(i)
            state, metrics = exp.train_step(state, exp.global_batch(batch))
            history.append({k: float(v) if np.ndim(v) == 0 else np.asarray(v)
                            for k, v in jax.device_get(metrics).items()})
    return history, state


MESHES = {
    "data=8": (dict(data=8), "fsdp_tensor", {}),
    "fsdp=8": (dict(data=1, fsdp=8), "fsdp", {}),
    "tensor=8": (dict(data=1, tensor=8), "tensor", {}),
    "data=2,fsdp=2,tensor=2": (dict(data=2, fsdp=2, tensor=2), "fsdp_tensor", {}),
    "zero1 data=2,fsdp=4": (dict(data=2, fsdp=4), "zero1", {}),
    "full-logits cross-entropy, vocab over tensor=2": (
        dict(data=2, fsdp=2, tensor=2), "fsdp_tensor", {"cross_entropy": "full_logits"}),
}


@pytest.mark.parametrize("config", [CONFIG, NEOX_CONFIG], ids=lambda c: c.family)
def test_same_losses_on_every_mesh(synthetic_source, config):
    data = batches(synthetic_source, 10)
    reference, _ = run(make_mesh(data=1, devices=jax.devices()[:1]), "fsdp_tensor", data, config=config)
    want = [m["loss"] for m in reference]
    assert want[-1] < want[0]  # it learns
    for name, (sizes, rules, settings) in MESHES.items():
        got = [m["loss"] for m in run(make_mesh(**sizes), rules, data, config=config, **settings)[0]]
        np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)


def test_gradient_accumulation_equals_one_big_batch(synthetic_source):
    data = batches(synthetic_source, 3)
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    whole, state_whole = run(mesh, "fsdp_tensor", data)
    accumulated, state_acc = run(mesh, "fsdp_tensor", data, grad_accum_steps=4)
    np.testing.assert_allclose([m["loss"] for m in accumulated], [m["loss"] for m in whole], rtol=1e-5)
    np.testing.assert_allclose([m["grad_norm"] for m in accumulated], [m["grad_norm"] for m in whole], rtol=1e-4)
    # atol covers parameters whose true gradient is zero (the key bias: softmax ignores it), where
    # Adam normalises rounding noise into tiny updates of arbitrary sign.
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                 state_acc.params, state_whole.params)


def test_evaluation_in_microbatches_equals_one_batch_and_the_training_loss(synthetic_source):
    """The eval step splits the batch as GRAD_ACCUM_STEPS does (so it never holds more activations
    than a training microbatch), with sums equal to one pass and Σ nll / Σ w equal to the train step's loss."""
    data = batches(synthetic_source, 1)
    mesh = make_mesh(data=2, tensor=2, devices=jax.devices()[:4])
    sums, temp_bytes = {}, {}
    for accum in (1, 4):
        exp = experiment(mesh, "fsdp_tensor", data, grad_accum_steps=accum)
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


def test_bfloat16_compute_tracks_float32(synthetic_source):
    """bf16 compute with fp32 params and loss stays within 2% of fp32 over 6 steps."""
    data = batches(synthetic_source, 6)
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    fp32, _ = run(mesh, "fsdp_tensor", data)
    bf16, _ = run(mesh, "fsdp_tensor", data, config=dataclasses.replace(CONFIG, dtype="bfloat16"))
    np.testing.assert_allclose([m["loss"] for m in bf16], [m["loss"] for m in fp32], rtol=2e-2)


def test_loss_scale_update_rules():
    config = trainer.LossScaleConfig(initial_scale_power=4, window=2, hysteresis=2, min_scale=4.0)
    scale = trainer.LossScale.create(config)
    scale = scale.update(np.bool_(False), config)  # first overflow: hysteresis absorbs it
    assert float(scale.scale) == 16.0 and int(scale.hysteresis_left) == 1
    scale = scale.update(np.bool_(False), config)  # second in a row: halve
    assert float(scale.scale) == 8.0 and int(scale.hysteresis_left) == 2
    for _ in range(3):
        scale = scale.update(np.bool_(False), config)
    assert float(scale.scale) == 4.0  # never below min_scale
    scale = scale.update(np.bool_(True), config)
    scale = scale.update(np.bool_(True), config)  # window of finite steps: double
    assert float(scale.scale) == 8.0 and int(scale.good_steps) == 0


def test_fp16_overflow_skips_the_step_and_halves_the_scale(synthetic_source):
    """A scale too large for float16 (2**24 times the mean loss) overflows: those steps are skipped and
    the scale halves (hysteresis 1) until it fits, then training goes on."""
    data = batches(synthetic_source, 8)
    loss_scale = trainer.LossScaleConfig(initial_scale_power=24, window=1000, hysteresis=1)
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    history, _ = run(mesh, "fsdp_tensor", data, config=dataclasses.replace(CONFIG, dtype="float16"),
                     loss_scale=loss_scale)
    skipped = [int(m["skipped"]) for m in history]
    overflows = skipped.index(0)
    assert 1 <= overflows < len(data) and skipped == [1] * overflows + [0] * (len(data) - overflows), skipped
    assert [m["loss_scale"] for m in history[:overflows + 1]] == [2.0 ** (24 - i) for i in range(overflows + 1)]
    # the logged rate is the one applied: skipped steps did not advance optax's schedule
    schedule = optim.make_optimizer(learning_rate=3e-3, warmup_steps=2, total_steps=len(data)).schedule
    applied = [0] * (overflows + 1) + list(range(1, len(data) - overflows))
    assert [m["learning_rate"] for m in history] == pytest.approx([float(schedule(n)) for n in applied])


def fp16_gradients_finite(exp, state, batch, scale: float, *, mean: bool) -> bool:
    """DeepSpeed's rule, computed here: float16 gradients of scale x (mean, or summed) loss are finite."""
    def loss(params):
        nll, _, weight = exp.lm.loss_sums(params, batch)
        return nll * scale / (weight if mean else 1.0)
    with exp.partitioner.activate():
        grads = jax.jit(jax.grad(loss))(state.params)
    return all(bool(np.isfinite(g).all()) for g in jax.tree.leaves(jax.device_get(grads)))


def test_deepspeeds_fp16_section_skips_what_deepspeed_would(synthetic_source):
    """CPM-Pretrain's ds_config fp16 block (initial_scale_power 16, window 1000, hysteresis 2): the scale
    multiplies the mean loss as DeepSpeed's does, so a step skips exactly when DeepSpeed's would."""
    data = batches(synthetic_source, 3)
    config = dataclasses.replace(CONFIG, dtype="float16")
    mesh = make_mesh(data=2, devices=jax.devices()[:2])
    loss_scale = trainer.LossScaleConfig(initial_scale_power=16, window=1000, hysteresis=2)
    exp = experiment(mesh, "fsdp_tensor", data, config=config, loss_scale=loss_scale)
    state = exp.init_state()
    batch = exp.global_batch(data[0])
    deepspeed_skips = not fp16_gradients_finite(exp, state, batch, 2.0 ** 16, mean=True)
    history, _ = run(mesh, "fsdp_tensor", data, config=config, loss_scale=loss_scale)
    assert int(history[0]["skipped"]) == int(deepspeed_skips) == 0
    assert [int(m["skipped"]) for m in history] == [0, 0, 0]
    # what the old rule (scale x summed loss, 128 tokens per step) would have done: overflow
    assert not fp16_gradients_finite(exp, state, batch, 2.0 ** 16, mean=False)


def test_an_update_that_overflows_is_not_applied(synthetic_source):
    """Finite loss and gradients, but a learning rate that sends parameters to infinity: the step is
    skipped like any non-finite step, and says that the update (not the gradients) overflowed."""
    data = batches(synthetic_source, 1)
    mesh = make_mesh(data=1, devices=jax.devices()[:1])
    exp = build_experiment(model=CONFIG, mesh=mesh, rules="fsdp_tensor", batch_size=8,
                           optimizer=optim.make_optimizer(learning_rate=3e38, warmup_steps=0, total_steps=2,
                                                          weight_decay=10.0),  # p - lr*(1 + wd*p) > float32 max
                           feature_lengths={"targets": SEQ_LEN})
    state = exp.init_state()
    before = jax.device_get((state.params, state.opt_state))
    with exp.partitioner.activate():
        new_state, metrics = exp.train_step(state, exp.global_batch(data[0]))
    assert int(metrics["skipped"]) == 1 and int(metrics["update_finite"]) == 0 and metrics["grad_finite"].all()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get((new_state.params, new_state.opt_state)), before)


def test_a_nonfinite_step_leaves_parameters_unchanged_and_flags_each_gradient(synthetic_source):
    data = batches(synthetic_source, 1)
    data[0] = dict(data[0], **{DECODER_LOSS_WEIGHTS: data[0][DECODER_LOSS_WEIGHTS] * np.float32(np.inf)})
    exp = experiment(make_mesh(data=1, devices=jax.devices()[:1]), "fsdp_tensor", data)
    state = exp.init_state()
    before = jax.device_get(state.params)
    with exp.partitioner.activate():
        new_state, metrics = exp.train_step(state, exp.global_batch(data[0]))
    assert int(metrics["skipped"]) == 1 and int(new_state.step) == 1
    assert metrics["grad_finite"].shape == (len(jax.tree.leaves(before)),) and not metrics["grad_finite"].any()
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(new_state.params), before)


class CompileLog(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        if "Compiling" in record.getMessage():
            self.messages.append(record.getMessage())


@pytest.mark.parametrize("config", [CONFIG, NEOX_CONFIG], ids=["gpt2", "neox"])
def test_nothing_recompiles_after_the_first_step(synthetic_source, config):
    handler = CompileLog()
    jax_logger = logging.getLogger("jax")

    def watch_after_first(i):
        if i == 1:
            jax.config.update("jax_log_compiles", True)
            jax_logger.addHandler(handler)

    try:
        run(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor", batches(synthetic_source, 5), config=config,
            steps_between=watch_after_first)
    finally:
        jax.config.update("jax_log_compiles", False)
        jax_logger.removeHandler(handler)
    assert handler.messages == []


def test_offloaded_optimizer_state_lives_in_host_memory_and_trains_the_same(synthetic_source):
    data = batches(synthetic_source, 3)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    want, _ = run(mesh, "fsdp_tensor", data)
    got, state = run(mesh, "fsdp_tensor", data, offload_optimizer_state=True)
    assert {x.sharding.memory_kind for x in jax.tree.leaves(state.opt_state)} == {"pinned_host"}
    assert {x.sharding.memory_kind for x in jax.tree.leaves(state.params)} == {"device"}
    np.testing.assert_allclose([m["loss"] for m in got], [m["loss"] for m in want], rtol=1e-6)
