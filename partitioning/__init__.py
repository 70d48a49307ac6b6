"""Meshes, logical-axis rules and the Partitioner: the only package that knows about meshes.

Its names load on first use (PEP 562), so `partitioning.errors`, which every CLI's error handling imports, does
not bring in jax: a data-only process (preprocess, its workers) starts without it."""
import importlib

from partitioning.errors import PartitioningError

_HOMES = {"AXES": "mesh", "MeshShape": "mesh", "make_mesh": "mesh", "resolve_axis_sizes": "mesh", "Partitioner": "partitioner",
          "RULE_SETS": "rules", "RuleSet": "rules", "get_rule_set": "rules"}

__all__ = ["PartitioningError", *_HOMES]


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'partitioning' has no attribute {name!r}")
    return getattr(importlib.import_module(f"partitioning.{_HOMES[name]}"), name)
