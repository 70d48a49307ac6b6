"""Pipeline parallelism: the same losses as data parallelism on every schedule, checkpoints that move
between pipelined and plain meshes, and errors that name the setting (CPU, 8 devices)."""
import dataclasses
import functools
import itertools
import json
import os
import re

import flax.linen as nn
import jax
import numpy as np
import pytest

from models.gpt2 import GPT2, GPT2Config
from models.llama import LlamaConfig
from models.neox import NeoXConfig
from partitioning import Partitioner, make_mesh
from partitioning.pipeline import Schedule
from t5x_like import optim
from t5x_like.checkpoint import store
from t5x_like.experiment import ExperimentSettings, build_experiment, pipeline_stack
from t5x_like.run import loop
from t5x_like.run.settings import LoopSettings, RunSettings
from tests.support.pipeline import saved_and_restored

pytestmark = pytest.mark.integration

SEQ_LEN, BATCH, STEPS, SEED = 16, 16, 10, 3
# 8 layers: 2 or 4 stages, each with 1 or 2 repeats, all divide them.
CONFIG = GPT2Config(vocab_size=256, max_len=SEQ_LEN, num_layers=8, num_heads=4, embed_dim=32, mlp_dim=64,
                    dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")
NEOX_CONFIG = NeoXConfig(vocab_size=256, max_len=SEQ_LEN, num_layers=8, num_heads=4, embed_dim=32, mlp_dim=64,
                         dtype="float32")
# Mistral's options: grouped key/value heads and a window of half the length (biases are GPT-2's and NeoX's here;
# no Llama-class model has both q/k/v biases and a window).
LLAMA_CONFIG = LlamaConfig(vocab_size=256, max_len=SEQ_LEN, num_layers=4, num_heads=4, num_key_value_heads=2,
                           embed_dim=32, mlp_dim=64, sliding_window=SEQ_LEN // 2, dtype="float32")


OPTIMIZER = optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=2, decay_steps=STEPS)


def batches(source_cls):
    source = source_cls("train", batch_size=BATCH, feature_lengths={"targets": SEQ_LEN}, seed=SEED, shard_index=0,
                        shard_count=1)
    return [next(source) for _ in range(STEPS)]


def settings(mesh, rules, *, schedule=(1, 1, 1), grad_accum_steps=1, config=CONFIG, seed=SEED) -> ExperimentSettings:
    """The run the train CLI would assemble for this mesh and pipeline schedule."""
    _, microbatches, repeats = schedule
    return ExperimentSettings(model=config, mesh=mesh, rules=rules, optimizer=OPTIMIZER, batch_size=BATCH,
                              feature_lengths={"targets": SEQ_LEN}, seed=seed, grad_accum_steps=grad_accum_steps,
                              pipeline_microbatches=microbatches, pipeline_repeats=repeats)


def experiment(mesh, rules, **kwargs):
    return build_experiment(settings(mesh, rules, **kwargs), train_steps=STEPS)


def losses(mesh, rules, data, **settings):
    """Per-step losses of training on `data` with the train CLI's own pieces."""
    exp = experiment(mesh, rules, **settings)
    state = exp.init_state()
    history = []
    with exp.partitioner.activate():
        for batch in data:
            state, metrics = exp.train_step(state, exp.global_batch(batch))
            history.append(float(metrics["loss"]))
    return history


def pipelined(config, stages, microbatches, repeats, rows, batch_shards):
    """The GPT-2 module with its layer stack pipelined by this schedule."""
    return GPT2(config, layer_stack=pipeline_stack(config, stages, microbatches, repeats, rows, batch_shards))


@functools.cache
def reference_losses(source_cls, config=CONFIG):
    return losses(make_mesh(data=8), "data_parallel", batches(source_cls), config=config)


CASES = {
    # name: (mesh sizes, rules, (stages, microbatches, repeats), grad_accum_steps, remat policy)
    "gpipe stage=2 x tensor=2 x data=2": (dict(data=2, stage=2, tensor=2), "tensor", (2, 4, 1), 1, "none"),
    "circular stage=4 x data=2, grad accumulation, remat": (dict(data=2, stage=4), "data_parallel", (4, 4, 2), 2,
                                                            "full"),
    "data=2 x fsdp=2 x tensor=2": (dict(data=2, fsdp=2, tensor=2), "fsdp_tensor", (1, 1, 1), 1, "none"),
}


FAMILY_CASES = {f"{family} {name}": (name, config) for family, config, names in (
    ("gpt2", CONFIG, list(CASES)[:2]), ("neox", NEOX_CONFIG, ["gpipe stage=2 x tensor=2 x data=2"]),
    ("llama", LLAMA_CONFIG, ["gpipe stage=2 x tensor=2 x data=2", "data=2 x fsdp=2 x tensor=2"])) for name in names}


@pytest.mark.parametrize("name, family_config", FAMILY_CASES.values(), ids=FAMILY_CASES)
def test_pipelined_training_equals_data_parallel(name, family_config, synthetic_source):
    sizes, rules, schedule, accum, remat = CASES[name]
    want = reference_losses(synthetic_source, family_config)
    assert want[-1] < want[0] - 0.1  # it learns, so equal curves mean something
    config = dataclasses.replace(family_config, remat_policy=remat)
    got = losses(make_mesh(**sizes), rules, batches(synthetic_source), schedule=schedule,
                 grad_accum_steps=accum, config=config)
    np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=name)


def test_train_resumes_a_plain_checkpoint_on_a_pipeline(tmp_path, synthetic_source):
    """Steps 1-3 on a plain mesh, then 4-6 resumed by the train CLI on a circular pipeline with fsdp:
    the uninterrupted plain run's losses (same parameter and optimizer-state layout)."""
    model_dir = str(tmp_path / "run")
    for steps, run in ((3, settings(make_mesh(data=8), "data_parallel")),
                       (6, settings(make_mesh(data=2, stage=2, fsdp=2), "fsdp", schedule=(2, 2, 2)))):
        loop.train(RunSettings(loop=LoopSettings(model_dir=model_dir, train_steps=steps, log_every=1), experiment=run),
                   data_source=synthetic_source)
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if '"loss"' in line]
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose([row["loss"] for row in rows], reference_losses(synthetic_source)[:6], rtol=1e-5)


def test_pipeline_checkpoint_restores_onto_a_plain_mesh(tmp_path):
    """A state saved from a 4-stage GPipe mesh restores onto a data-parallel mesh unchanged."""
    def state_on(mesh, rules, schedule, seed):
        exp = experiment(mesh, rules, schedule=schedule, seed=seed)
        return exp.init_state(), exp.shardings

    saved, _ = state_on(make_mesh(data=2, stage=4), "data_parallel", (4, 4, 1), seed=1)
    assert saved.params["blocks"]["mlp"]["fc_kernel"].sharding.spec[0] == "stage"
    target, shardings = state_on(make_mesh(data=8), "data_parallel", (1, 1, 1), seed=2)
    restored = saved_and_restored(tmp_path, saved, target, shardings)
    assert restored.params["blocks"]["mlp"]["fc_kernel"].sharding.spec == shardings.params["blocks"]["mlp"][
        "fc_kernel"].spec


def test_gpipe_moves_activations_not_weights():
    """Each stage keeps its own layers: the compiled gradient has collective permutes (the rotation)
    and no all-gather or all-to-all of weights."""
    partitioner = Partitioner(make_mesh(data=2, stage=4), "data_parallel")
    module = pipelined(CONFIG, 4, 4, 1, BATCH, partitioner.batch_shards)
    tokens = jax.ShapeDtypeStruct((BATCH, SEQ_LEN), "int32", sharding=partitioner.batch_sharding())
    boxed = jax.eval_shape(module.init, jax.random.PRNGKey(0), jax.numpy.zeros((1, SEQ_LEN), "int32"))
    params = store.with_shardings(nn.meta.unbox(boxed)["params"],
                                        partitioner.shardings(nn.get_partition_spec(boxed))["params"])
    with partitioner.activate():
        grad = jax.jit(jax.grad(lambda p, t: module.apply({"params": p}, t).mean()))
        hlo = grad.lower(params, tokens).compile().as_text()
    count = lambda op: len(re.findall(rf"\b{op}(-start)?\(", hlo))  # noqa: E731
    assert count("collective-permute") > 0
    assert count("all-gather") == count("all-to-all") == 0


def test_bubble_fraction():
    assert Schedule(4, 8).bubble_fraction == pytest.approx(3 / 11)
    assert Schedule(4, 8, repeats=2).bubble_fraction == pytest.approx(3 / 19)
    assert Schedule(1, 1).bubble_fraction == 0.0
    assert "bubble fraction 0.273" in Schedule(4, 8).describe()


@pytest.mark.parametrize("schedule, layers, rows, shards, match", [
    ((4, 4, 1), 6, 16, 1, "num_layers=6 does not divide into PIPELINE_PARALLEL=4"),
    ((2, 4, 2), 6, 16, 1, r"PIPELINE_REPEATS=2 = 4 equal chunks"),
    ((2, 3, 1), 8, 16, 1, "do not split into NUM_MICROBATCHES=3"),
    ((2, 4, 1), 8, 16, 8, "microbatch has 4 rows .* does not divide over the 8 data-parallel shards"),
])
def test_what_does_not_divide_is_named(schedule, layers, rows, shards, match):
    with pytest.raises(ValueError, match=match):
        Schedule(*schedule).check({"num_layers": layers}, rows, shards)


def test_circular_schedule_needs_enough_microbatches():
    with pytest.raises(ValueError, match="NUM_MICROBATCHES >= PIPELINE_PARALLEL, got 2 < 4"):
        Schedule(4, 2, repeats=2)


def test_microbatches_without_stages_are_rejected():
    with pytest.raises(ValueError, match="need PIPELINE_PARALLEL > 1.*GRAD_ACCUM_STEPS"):
        pipeline_stack(CONFIG, 1, 4, 1, BATCH, 1)


def test_pipeline_needs_scanned_layers():
    config = dataclasses.replace(CONFIG, scan_layers=False)
    module = pipelined(config, 2, 2, 1, BATCH, 1)
    with pytest.raises(ValueError, match="scan_layers=True"):
        jax.eval_shape(module.init, jax.random.PRNGKey(0), jax.numpy.zeros((2, SEQ_LEN), "int32"))


def test_pipeline_dropout_is_seeded_and_off_when_deterministic():
    """The pipelined stack (2 stages, 2 microbatches of 2 rows) with attention dropout (drawn in the blocks):
    deterministic, exactly the stack with dropout rates 0; with dropout, masks that depend on the seed
    alone (two separate compilations agree on one seed; another seed differs) and differ between rows
    and between microbatches (the iteration is folded in), so four identical rows come out four ways."""
    config = dataclasses.replace(CONFIG, attention_dropout_rate=0.5)  # every mask drawn inside the pipelined blocks
    module = pipelined(config, 2, 2, 1, 4, 1)
    tokens = jax.numpy.tile(jax.numpy.arange(SEQ_LEN) * 5 % 256, (4, 1))  # four identical rows
    params = jax.jit(module.init)(jax.random.PRNGKey(0), tokens[:1])
    without = np.asarray(jax.jit(pipelined(CONFIG, 2, 2, 1, 4, 1).apply)(params, tokens))
    np.testing.assert_allclose(jax.jit(module.apply)(params, tokens), without, rtol=0, atol=1e-6)

    def compiled():  # a fresh trace and compilation: a mask drawn from anything but the seed shows up
        fn = jax.jit(lambda key: module.apply(params, tokens, deterministic=False, rngs={"dropout": key}))
        return lambda seed: np.asarray(fn(jax.random.PRNGKey(seed)))

    first = compiled()(1)
    assert not np.allclose(first, without, atol=1e-3)
    for i, j in itertools.combinations(range(4), 2):
        assert not np.allclose(first[i], first[j], atol=1e-3), f"rows {i} and {j} drew the same masks"
    again = compiled()
    np.testing.assert_array_equal(again(1), first)
    assert not np.allclose(again(2), first, atol=1e-3)
