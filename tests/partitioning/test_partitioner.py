import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from partitioning import Partitioner, make_mesh


class TwoLayer(nn.Module):
    vocab: int = 64
    embed: int = 16
    mlp: int = 32

    @nn.compact
    def __call__(self, ids):
        table = self.param("table", nn.with_logical_partitioning(nn.initializers.normal(), ("vocab", "embed")),
                           (self.vocab, self.embed))
        w = self.param("w", nn.with_logical_partitioning(nn.initializers.normal(), ("embed", "mlp")),
                       (self.embed, self.mlp))
        return jnp.take(table, ids, axis=0) @ w


def abstract_and_specs(module, partitioner):
    with partitioner.activate():
        abstract = jax.eval_shape(module.init, jax.random.PRNGKey(0), jnp.zeros((8,), jnp.int32))
    return abstract, nn.get_partition_spec(abstract)


def test_fsdp_tensor_rules_place_parameters():
    partitioner = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor")
    abstract, specs = abstract_and_specs(TwoLayer(), partitioner)
    shardings = partitioner.shardings(specs)
    assert shardings["params"]["table"].spec == P("tensor", "fsdp")
    assert shardings["params"]["w"].spec == P("fsdp", "tensor")
    assert partitioner.batch_sharding().spec == P(("data", "fsdp", "expert"), None)
    assert partitioner.batch_shards == 4


def test_zero1_replicates_params_but_shards_optimizer_state():
    partitioner = Partitioner(make_mesh(data=4, fsdp=2), "zero1")
    _, specs = abstract_and_specs(TwoLayer(), partitioner)
    assert partitioner.shardings(specs)["params"]["w"].spec == P(None, None)
    assert partitioner.shardings(specs, "opt_state")["params"]["w"].spec == P("fsdp", None)


def test_sharded_init_never_gathers_on_one_device():
    partitioner = Partitioner(make_mesh(data=1, fsdp=4, tensor=2), "fsdp_tensor")
    module = TwoLayer()
    _, specs = abstract_and_specs(module, partitioner)
    shardings = partitioner.shardings(specs)
    with partitioner.activate():
        params = jax.jit(lambda r: nn.meta.unbox(module.init(r, jnp.zeros((8,), jnp.int32))),
                         out_shardings=shardings)(jax.random.PRNGKey(0))
    table = params["params"]["table"]
    assert table.sharding.spec == P("tensor", "fsdp")
    assert {s.data.shape for s in table.addressable_shards} == {(32, 4)}


def test_dimension_that_does_not_divide_is_named():
    partitioner = Partitioner(make_mesh(data=1, fsdp=1, tensor=8), "tensor")
    abstract, specs = abstract_and_specs(TwoLayer(vocab=60), partitioner)
    with pytest.raises(ValueError, match=r"params/table: dimension 0 \('vocab', size 60\).*TENSOR_PARALLEL"):
        partitioner.check_divisible(abstract, specs)


def test_unused_mesh_axis_is_rejected():
    with pytest.raises(ValueError, match="TENSOR_PARALLEL=1"):
        Partitioner(make_mesh(data=4, tensor=2), "data_parallel")


def test_unknown_rule_set():
    with pytest.raises(ValueError, match="fsdp_tensor"):
        Partitioner(make_mesh(), "megatron")


def test_describe_lists_every_parameter():
    partitioner = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor")
    abstract, specs = abstract_and_specs(TwoLayer(), partitioner)
    table = partitioner.describe(abstract, specs)
    assert "params/table  (64, 16)" in table and "('tensor', 'fsdp')" in table
    assert "params/w" in table
