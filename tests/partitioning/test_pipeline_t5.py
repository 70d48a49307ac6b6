"""Encoder-decoder (T5) pipeline parallelism: the encoder and then the decoder each pipelined over every
stage. Training equals one device (loss and grad norm, fp32, 1e-5) with tensor and data parallelism,
GPipe and circular, with a position bias per row and one shared by every row; a shared layer argument
reaches every microbatch without being broadcast to the batch; a pipelined checkpoint restores onto
a plain mesh; a stack the stages do not divide is named (CPU, 8 devices)."""
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.t5 import T5Config
from partitioning import make_mesh, pipeline
from t5x_like import optim
from t5x_like.data import SourceSettings, make_source
from t5x_like.experiment import ExperimentSettings, build_experiment, pipeline_stack
from t5x_like.features import DECODER_POSITIONS
from tests.support.pipeline import saved_and_restored

pytestmark = pytest.mark.integration

LENGTHS, BATCH, STEPS = {"inputs": 32, "targets": 8}, 8, 3
# 4 + 4 layers: 2 stages x 2 repeats divide both stacks; 4 heads and the vocabulary divide tensor=2.
CONFIG = T5Config(vocab_size=8292, num_layers=4, num_decoder_layers=4, num_heads=4, embed_dim=32, d_kv=8, mlp_dim=64,
                  feed_forward="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0, dtype="float32")


@functools.cache
def batches():
    """Packed span-corruption rows whose decoder side counts positions across its documents: the encoder's
    position bias is per row [batch, heads, inputs, inputs] (split into microbatches), the decoder's
    shared [1, heads, targets, targets] (read whole by every microbatch)."""
    source = make_source("train", SourceSettings(packing=True, objective="span_corruption"), batch_size=BATCH,
                         feature_lengths=LENGTHS, seed=3, shard_index=0, shard_count=1)
    return [{k: v for k, v in next(source).items() if k != DECODER_POSITIONS} for _ in range(STEPS)]


def experiment(mesh, rules, schedule=(1, 1, 1), seed=0):
    _, microbatches, repeats = schedule
    optimizer = optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=1)
    return build_experiment(ExperimentSettings(model=CONFIG, mesh=mesh, rules=rules, optimizer=optimizer,
                                               batch_size=BATCH, feature_lengths=LENGTHS, seed=seed,
                                               pipeline_microbatches=microbatches, pipeline_repeats=repeats),
                            train_steps=STEPS)


def curves(mesh, rules, data, schedule=(1, 1, 1)):
    """(losses, grad norms) of training on `data`."""
    exp = experiment(mesh, rules, schedule)
    state, history = exp.init_state(), []
    with exp.partitioner.activate():
        for batch in data:
            state, metrics = exp.train_step(state, exp.global_batch(batch))
            history.append((float(metrics["loss"]), float(metrics["grad_norm"])))
    return np.array(history)


@functools.cache
def one_device():
    return curves(make_mesh(data=1, devices=jax.devices()[:1]), "fsdp_tensor", batches())


CASES = {
    # name: (mesh sizes, rules, (stages, microbatches, repeats))
    "gpipe stage=2 x tensor=2": (dict(data=1, stage=2, tensor=2), "tensor", (2, 2, 1)),
    "circular x2 stage=2 x data=2": (dict(data=2, stage=2), "data_parallel", (2, 2, 2)),
}


@pytest.mark.parametrize("name", CASES)
def test_pipelined_training_equals_one_device(name):
    sizes, rules, schedule = CASES[name]
    want = one_device()
    assert want[-1, 0] < want[0, 0]  # it learns, so equal curves mean something
    got = curves(make_mesh(**sizes, devices=jax.devices()[:4]), rules, batches(), schedule)
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)


def test_shared_arguments_reach_every_microbatch_whole():
    """A layer argument with the batch leading is split with the rows; one leading with 1 is read whole by
    every microbatch, and nothing the batch's size times its own is ever built."""
    rows, stages, width = 12, 2, 5
    weights = {"w": jnp.linspace(0.5, 1.5, 4 * width).reshape(4, width)}
    x = jnp.arange(rows * width, dtype=jnp.float32).reshape(rows, width) / 10
    per_row, shared = jnp.cos(x), jnp.sin(jnp.arange(7 * width, dtype=jnp.float32)).reshape(1, 7, width)

    def layer(variables, x, per_row, shared, rngs=None):
        return jnp.tanh(x * variables["params"]["w"] + per_row + shared.sum(1)), None

    want = x
    for i in range(4):
        want, _ = layer({"params": {"w": weights["w"][i]}}, want, per_row, shared)
    schedule = pipeline.Schedule(stages, microbatches=3, repeats=2)
    run = functools.partial(pipeline.run, layer, rng=None, schedule=schedule)
    np.testing.assert_allclose(run(weights, x, (per_row, shared)), want, rtol=1e-6)
    jaxpr = str(jax.make_jaxpr(lambda w, x, a, b: run(w, x, (a, b)))(weights, x, per_row, shared))
    copies = [np.prod([int(d) for d in lead.split(",") if d]) for lead in re.findall(r"f32\[([\d,]*?),?7,5\]", jaxpr)]
    assert max(copies) == stages  # one copy per stage, none per row or microbatch
    with pytest.raises(ValueError, match=r"shape \(4, 5\) leads with neither the batch's 12 rows nor 1"):
        run(weights, x, (per_row[:4], shared))


def test_pipelined_checkpoint_restores_onto_a_plain_mesh(tmp_path):
    """Both stacks keep their [layers, ...] parameters, split over 'stage': a state saved from a pipelined
    mesh restores onto a data-parallel one unchanged."""
    def state_on(mesh, rules, schedule, seed):
        exp = experiment(mesh, rules, schedule, seed)
        return exp.init_state(), exp.shardings

    saved, _ = state_on(make_mesh(data=2, stage=2, fsdp=2), "fsdp", (2, 2, 1), seed=1)
    for stack in ("encoder", "decoder"):
        assert saved.params[stack]["blocks"]["mlp"]["fc_kernel"].sharding.spec[0] == "stage"
    target, shardings = state_on(make_mesh(data=8), "data_parallel", (1, 1, 1), seed=2)
    saved_and_restored(tmp_path, saved, target, shardings)


def test_a_stack_the_stages_do_not_divide_is_named():
    config = T5Config(num_layers=4, num_decoder_layers=6)
    with pytest.raises(ValueError, match=r"num_decoder_layers=6 does not divide into PIPELINE_PARALLEL=4 .* "
                                        r"\(num_layers=4, num_decoder_layers=6\)"):
        pipeline_stack(config, 4, 4, 1, BATCH, 1)
    assert "x 2 stacks in turn (2 bubbles per step), bubble fraction 0.200" in \
        pipeline.Schedule(2, 4).describe(len(CONFIG.pipeline_stacks()))
