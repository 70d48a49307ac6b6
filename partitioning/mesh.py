"""Device meshes from named sizes. Axes, outermost first: data, stage, fsdp, expert, tensor."""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
from jax.sharding import AxisType, Mesh

from partitioning.errors import PartitioningError

AXES = ("data", "stage", "fsdp", "expert", "tensor")


MACROS = {"data": "DATA_PARALLEL", "stage": "PIPELINE_PARALLEL", "fsdp": "FSDP_PARALLEL", "expert": "EXPERT_PARALLEL",
          "tensor": "TENSOR_PARALLEL"}


def resolve_axis_sizes(sizes: dict[str, int], num_devices: int, *, simulable: bool = False) -> dict[str, int]:
    """Replace the one -1 entry by whatever fills `num_devices`; check the product. `simulable`: the devices are
    one process's CPU devices, so a mesh that needs more is told how to simulate them (can_simulate)."""
    unknown = sorted(set(sizes) - set(AXES))
    if unknown:
        raise PartitioningError(f"mesh axes {unknown} are unknown; the axes are {AXES}.")
    sizes = {axis: int(sizes.get(axis, 1)) for axis in AXES}
    fill = [axis for axis, size in sizes.items() if size == -1]
    if len(fill) > 1:
        raise PartitioningError(f"mesh axes {fill} are all -1; at most one axis may be -1 (fill).")
    bad = {axis: size for axis, size in sizes.items() if size < 1 and size != -1}
    if bad:
        raise PartitioningError(f"mesh axis sizes {bad} must be positive (or -1 for one axis to fill).")
    known = math.prod(size for size in sizes.values() if size != -1)
    if known > num_devices:
        given = " ".join(f"{MACROS[axis]}={size}" for axis, size in sizes.items() if size > 1)
        raise PartitioningError(f"{given}: {too_few_devices(known, num_devices, simulable)}")
    if fill:
        if num_devices % known:
            raise PartitioningError(
                f"cannot fill mesh axis {fill[0]!r}: the other axes multiply to {known}, which does "
                f"not divide the {num_devices} devices. Choose sizes whose product divides {num_devices}."
            )
        sizes[fill[0]] = num_devices // known
    elif known != num_devices:
        raise PartitioningError(
            f"mesh {sizes} has {known} devices but {num_devices} are available; make the product of "
            "DATA_PARALLEL, PIPELINE_PARALLEL, FSDP_PARALLEL, EXPERT_PARALLEL and TENSOR_PARALLEL equal the device "
            "count, or set one of them to -1 to fill."
        )
    return sizes


def can_simulate(devices: Sequence[jax.Device]) -> bool:
    """Whether XLA_FLAGS can give this process more devices of this kind: CPU devices of one process."""
    return bool(devices) and devices[0].platform == "cpu" and len({d.process_index for d in devices}) == 1


def too_few_devices(needed: int, present: int, simulable: bool) -> str:
    """The sentence for a mesh that needs more devices than are present, with the fix (on one process's CPU
    devices, `simulable`: how to simulate them)."""
    fix = (f"to run it on this CPU, simulate {needed} devices: start the command with "
           f"XLA_FLAGS=--xla_force_host_platform_device_count={needed}" if simulable else
           f"run it where {needed} devices are")
    return (f"the mesh needs {needed} devices, but only {present} {'is' if present == 1 else 'are'} present; {fix} "
            "(or lower those sizes).")


DCN_MACROS = {"data": "DCN_DATA_PARALLEL", "stage": "DCN_PIPELINE_PARALLEL", "fsdp": "DCN_FSDP_PARALLEL",
              "expert": "DCN_EXPERT_PARALLEL", "tensor": "DCN_TENSOR_PARALLEL"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshShape:
    """A mesh's axis sizes (DATA_PARALLEL, ... and their DCN_ twins; gin: partitioning.make_mesh.*), built into a
    Mesh with `build`. The sizes are whole axes. `dcn_*` say how many ways of an axis run between slices (TPU) or
    nodes (GPU, CPU: one process per node) over the data-centre network; the rest of each axis stays inside a slice
    or node (ICI / NVLink). `devices`: the devices it spans (None: every device of the job)."""

    data: int = -1
    stage: int = 1
    fsdp: int = 1
    tensor: int = 1
    expert: int = 1
    dcn_data: int = 1
    dcn_stage: int = 1
    dcn_fsdp: int = 1
    dcn_tensor: int = 1
    dcn_expert: int = 1
    devices: Sequence[jax.Device] | None = None

    def sizes(self) -> dict[str, int]:
        """Each axis's size as given (-1: fills)."""
        return {axis: getattr(self, axis) for axis in AXES}

    def dcn(self) -> dict[str, int]:
        """Each axis's ways between slices or nodes."""
        return {axis: getattr(self, f"dcn_{axis}") for axis in AXES}

    def build(self, devices: Sequence[jax.Device] | None = None) -> Mesh:
        """The mesh over `devices` (default: its own, else all) with Auto axes ('data', 'stage', 'fsdp', 'expert',
        'tensor'); with any dcn size > 1 the devices are arranged by jax's `mesh_utils.create_hybrid_device_mesh`,
        as MaxText does."""
        devices = list(devices if devices is not None else self.devices if self.devices is not None else
                       jax.devices())
        sizes = resolve_axis_sizes(self.sizes(), len(devices), simulable=can_simulate(devices))
        shape = tuple(sizes[axis] for axis in AXES)
        axis_types = (AxisType.Auto,) * len(AXES)
        if all(size == 1 for size in self.dcn().values()):
            return jax.make_mesh(shape, AXES, axis_types=axis_types, devices=devices)
        return Mesh(hybrid_devices(sizes, self.dcn(), devices), AXES, axis_types=axis_types)


def make_mesh(**sizes) -> Mesh:
    """MeshShape(**sizes).build(): a mesh of these axis sizes (data=-1, stage=1, ... dcn_data=1, ..., devices)."""
    return MeshShape(**sizes).build()


def hybrid_devices(sizes: dict[str, int], dcn: dict[str, int], devices: list[jax.Device]):
    """The device array of a hybrid mesh: ICI sizes inside each slice / node, DCN sizes between them."""
    from jax.experimental import mesh_utils

    for axis, ways in dcn.items():
        if not isinstance(ways, int) or ways < 1 or sizes[axis] % ways:
            raise PartitioningError(f"{DCN_MACROS[axis]}={ways!r} must be a positive divisor of the {axis!r} axis size "
                            f"{sizes[axis]}: the axis is DCN x ICI ways; change {DCN_MACROS[axis]} or the axis size.")
    granules = slice_groups(devices)
    across = math.prod(dcn.values())
    if across != len(granules):
        unit = "slices" if devices[0].platform == "tpu" else "processes (nodes)"
        raise PartitioningError(f"the DCN sizes {', '.join(f'{DCN_MACROS[a]}={w}' for a, w in dcn.items() if w > 1)} "
                        f"multiply to {across}, but the devices form {len(granules)} {unit}; make the product of "
                        f"the DCN_* macros {len(granules)}.")
    ici = [sizes[axis] // dcn[axis] for axis in AXES]
    return mesh_utils.create_hybrid_device_mesh(ici, [dcn[axis] for axis in AXES], devices,
                                                process_is_granule=devices[0].platform != "tpu")


def slice_groups(devices: Sequence[jax.Device]) -> set[int]:
    """The TPU slices, or on other platforms the processes (one per node), the devices belong to."""
    key = "slice_index" if devices[0].platform == "tpu" else "process_index"
    return {getattr(d, key) for d in devices}
