"""What the kernels need to know about the ambient mesh, read without importing one.

The trainer enters its mesh with `jax.set_mesh(mesh)` and its logical-axis rules with
`flax.linen.logical_axis_rules(...)`; kernels that run per shard inside `jax.shard_map` ask here
which mesh axes a logical axis is split over.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax


def active_mesh():
    """The ambient abstract mesh if it splits anything (an automatic axis larger than 1), else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or all(mesh.shape[a] == 1 for a in mesh.auto_axes):
        return None
    return mesh


def mesh_axes(logical: str, mesh, divides: int) -> tuple[str, ...]:
    """The automatic mesh axes the active rules map `logical` to, or () unless they divide `divides`."""
    spec = nn.logical_to_mesh_axes((logical,))
    names = spec[0] if spec is not None else None
    names = (names,) if isinstance(names, str) else tuple(names or ())
    names = tuple(a for a in names if a in mesh.auto_axes and mesh.shape[a] > 1)
    return names if divides % axes_size(mesh, names) == 0 else ()


def axes_size(mesh, axes: tuple[str, ...]) -> int:
    return math.prod(mesh.shape[a] for a in axes)
