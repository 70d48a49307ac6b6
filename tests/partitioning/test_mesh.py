import jax
import pytest
from jax.sharding import AxisType

from partitioning import make_mesh, resolve_axis_sizes
from partitioning.errors import PartitioningError


def test_fill_axis_takes_remaining_devices():
    assert resolve_axis_sizes({"data": -1, "tensor": 2}, 8) == {"data": 4, "stage": 1, "fsdp": 1, "expert": 1, "tensor": 2}


def test_mesh_has_auto_axes_in_design_order():
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    assert mesh.axis_names == ("data", "stage", "fsdp", "expert", "tensor")
    assert dict(mesh.shape) == {"data": 2, "stage": 1, "fsdp": 2, "expert": 1, "tensor": 2}
    assert all(t == AxisType.Auto for t in mesh.axis_types)


def test_mesh_on_a_subset_of_devices():
    mesh = make_mesh(data=1, devices=jax.devices()[:1])
    assert mesh.size == 1


@pytest.mark.parametrize("sizes, match", [
    ({"data": 3, "tensor": 2}, "6 devices but 8 are available"),
    ({"data": -1, "fsdp": -1}, "at most one axis may be -1"),
    ({"data": -1, "tensor": 3}, "does not divide the 8 devices"),
    ({"data": 0}, "must be positive"),
    ({"model": 2}, "unknown"),
])
def test_bad_mesh_sizes_name_the_fix(sizes, match):
    with pytest.raises(ValueError, match=match):
        resolve_axis_sizes(sizes, 8)


@pytest.mark.parametrize("sizes, named", [({"tensor": 16}, "TENSOR_PARALLEL=16"),
                                          ({"data": -1, "fsdp": 4, "stage": 4}, "PIPELINE_PARALLEL=4 FSDP_PARALLEL=4"),
                                          ({"data": 16}, "DATA_PARALLEL=16")])
def test_a_mesh_needing_more_devices_says_how_many_and_how_to_simulate_them_on_cpu(sizes, named):
    with pytest.raises(PartitioningError) as raised:
        make_mesh(**sizes)
    assert str(raised.value) == (
        f"{named}: the mesh needs 16 devices, but only 8 are present; to run it on this CPU, simulate 16 devices: "
        "start the command with XLA_FLAGS=--xla_force_host_platform_device_count=16 (or lower those sizes).")


def test_too_few_devices_elsewhere_names_the_count_without_the_cpu_hint():
    with pytest.raises(PartitioningError, match=r"^TENSOR_PARALLEL=2: the mesh needs 2 devices, but only 1 is present; "
                                                r"run it where 2 devices are \(or lower those sizes\)\.$"):
        resolve_axis_sizes({"data": -1, "tensor": 2}, 1)


def test_dcn_sizes_must_divide_the_axis_and_match_the_nodes():
    with pytest.raises(PartitioningError, match=r"DCN_DATA_PARALLEL=3 must be a positive divisor of the 'data' axis size 4"):
        make_mesh(data=4, tensor=2, dcn_data=3)
    with pytest.raises(PartitioningError, match=r"multiply to 2, but the devices form 1 processes.*DCN_\* macros 1"):
        make_mesh(data=4, tensor=2, dcn_data=2)


def test_dcn_of_one_is_the_plain_mesh():
    plain, hybrid = make_mesh(data=4, tensor=2), make_mesh(data=4, tensor=2, dcn_data=1, dcn_tensor=1)
    assert (plain.devices == hybrid.devices).all() and plain.axis_names == hybrid.axis_names
