"""Meshes, logical-axis rules and the Partitioner: the only package that knows about meshes."""
from partitioning.errors import PartitioningError
from partitioning.mesh import AXES, make_mesh, resolve_axis_sizes
from partitioning.partitioner import Partitioner
from partitioning.rules import RULE_SETS, RuleSet, get_rule_set

__all__ = ["AXES", "PartitioningError", "make_mesh", "resolve_axis_sizes", "Partitioner", "RULE_SETS", "RuleSet", "get_rule_set"]
