"""Sequence parallelism (rule sets 'tensor_sequence' and 'fsdp_tensor_sequence'): the same losses as
the same mesh without it, the residual stream between blocks split along the sequence over 'tensor' in
the compiled train step, and fewer temporary bytes per device (CPU, 8 devices, a tiny GPT-2)."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from models.gpt2 import GPT2Config
from models.layers.decoder import DecoderBlock
from partitioning import make_mesh
from t5x_like import optim
from t5x_like.experiment import ExperimentSettings, build_experiment

pytestmark = pytest.mark.integration

SEQ_LEN, BATCH, STEPS, EMBED = 16, 8, 3, 32
CONFIG = GPT2Config(vocab_size=256, max_len=SEQ_LEN, num_layers=2, num_heads=4, embed_dim=EMBED, mlp_dim=64,
                    dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")


def experiment(rules, mesh):
    return build_experiment(ExperimentSettings(
        model=CONFIG, mesh=mesh, rules=rules, batch_size=BATCH, seed=0, feature_lengths={"targets": SEQ_LEN},
        optimizer=optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=1)), train_steps=STEPS)


def train(exp, state, data):
    """Per-step losses of the train CLI's own step on `data` from `state`, the shardings the compiler
    chose for each block's input and output (the residual stream between blocks), and the step's
    temporary bytes per device."""
    residual = []

    def record_block_shardings(next_fun, args, kwargs, context):
        out = next_fun(*args, **kwargs)
        if isinstance(context.module, DecoderBlock) and context.method_name == "__call__":
            for x in (args[0], out[0]):
                jax.debug.inspect_array_sharding(x, callback=residual.append)
        return out

    abstract_state = exp.sharded_abstract_state()
    with exp.partitioner.activate(), nn.intercept_methods(record_block_shardings):
        step = exp.train_step.lower(abstract_state, exp.abstract_batch()).compile()
    losses = []
    with exp.partitioner.activate():
        for batch in data:
            state, metrics = step(state, exp.global_batch(batch))
            losses.append(float(metrics["loss"]))
    assert residual, "no block was traced"
    return losses, residual, step.memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("rules, mesh_sizes", [("tensor", dict(data=2, tensor=4)),
                                               ("fsdp_tensor", dict(data=2, fsdp=2, tensor=2))])
def test_sequence_parallel_same_losses_residual_split_along_the_sequence(rules, mesh_sizes, synthetic_source):
    source = synthetic_source("train", batch_size=BATCH, feature_lengths={"targets": SEQ_LEN}, seed=3,
                              shard_index=0, shard_count=1)
    data = [next(source) for _ in range(STEPS)]
    mesh = make_mesh(**mesh_sizes)
    plain_exp, split_exp = experiment(rules, mesh), experiment(f"{rules}_sequence", mesh)
    state = plain_exp.init_state()
    initial = jax.device_get(state)  # the same start for both (parameters are laid out alike)
    want, plain, plain_bytes = train(plain_exp, state, data)
    got, split, split_bytes = train(split_exp, jax.device_put(initial, split_exp.shardings), data)

    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert want[-1] < want[0]  # it trains
    rows = BATCH // (mesh_sizes["data"] * mesh_sizes.get("fsdp", 1))
    assert {s.shard_shape((BATCH, SEQ_LEN, EMBED)) for s in plain} == {(rows, SEQ_LEN, EMBED)}
    assert {s.shard_shape((BATCH, SEQ_LEN, EMBED)) for s in split} == {
        (rows, SEQ_LEN // mesh_sizes["tensor"], EMBED)}
    assert all(s.spec[1] == "tensor" for s in split), [s.spec for s in split]
    assert split_bytes < plain_bytes, (split_bytes, plain_bytes)
