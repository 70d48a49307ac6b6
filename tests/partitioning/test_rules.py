"""partitioning/rules.py: rule sets by name, and the mesh axes each one uses."""
import pytest

from partitioning import rules
from partitioning.errors import PartitioningError


def test_get_rule_set_returns_the_named_set():
    for name, rule_set in rules.RULE_SETS.items():
        assert rules.get_rule_set(name) is rule_set
        assert rule_set.name == name


def test_unknown_rule_set_is_a_user_error_listing_the_choices():
    with pytest.raises(PartitioningError) as raised:
        rules.get_rule_set("megatron")
    assert str(raised.value) == f"rule set 'megatron' is unknown; choose one of {sorted(rules.RULE_SETS)}."


def test_zero1_shards_only_the_optimizer_state():
    zero1 = rules.get_rule_set("zero1")
    assert dict(zero1.params)["embed"] is None
    assert dict(zero1.opt_state)["embed"] == "fsdp"


def test_mesh_axes_used():
    assert rules.get_rule_set("data_parallel").mesh_axes_used == {"data", "fsdp", "stage", "expert"}
    assert rules.get_rule_set("fsdp_tensor_sequence").mesh_axes_used == {"data", "fsdp", "stage", "expert", "tensor"}
