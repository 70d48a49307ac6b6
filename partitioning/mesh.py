"""Device meshes from named sizes. Axes, outermost first: data, stage, fsdp, tensor."""
from __future__ import annotations

import math
from typing import Sequence

import jax
from jax.sharding import AxisType, Mesh

from t5x_like.errors import UserError

AXES = ("data", "stage", "fsdp", "tensor")


def resolve_axis_sizes(sizes: dict[str, int], num_devices: int) -> dict[str, int]:
    """Replace the one -1 entry by whatever fills `num_devices`; check the product."""
    unknown = sorted(set(sizes) - set(AXES))
    if unknown:
        raise UserError(f"mesh axes {unknown} are unknown; the axes are {AXES}.")
    sizes = {axis: int(sizes.get(axis, 1)) for axis in AXES}
    fill = [axis for axis, size in sizes.items() if size == -1]
    if len(fill) > 1:
        raise UserError(f"mesh axes {fill} are all -1; at most one axis may be -1 (fill).")
    bad = {axis: size for axis, size in sizes.items() if size < 1 and size != -1}
    if bad:
        raise UserError(f"mesh axis sizes {bad} must be positive (or -1 for one axis to fill).")
    known = math.prod(size for size in sizes.values() if size != -1)
    if fill:
        if num_devices % known:
            raise UserError(
                f"cannot fill mesh axis {fill[0]!r}: the other axes multiply to {known}, which does "
                f"not divide the {num_devices} devices. Choose sizes whose product divides {num_devices}."
            )
        sizes[fill[0]] = num_devices // known
    elif known != num_devices:
        raise UserError(
            f"mesh {sizes} has {known} devices but {num_devices} are available; make the product of "
            "DATA_PARALLEL, PIPELINE_PARALLEL, FSDP_PARALLEL and TENSOR_PARALLEL equal the device "
            "count, or set one of them to -1 to fill."
        )
    return sizes


def make_mesh(data: int = -1, stage: int = 1, fsdp: int = 1, tensor: int = 1, *,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh over `devices` (default: all) with Auto axes ('data', 'stage', 'fsdp', 'tensor')."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_axis_sizes(dict(data=data, stage=stage, fsdp=fsdp, tensor=tensor), len(devices))
    shape = tuple(sizes[axis] for axis in AXES)
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)
