"""The flash-attention kernels lower for the accelerators (no accelerator needed).

jax.export cross-lowers the forward+backward to StableHLO for CUDA (Pallas -> Triton IR) and for
TPU (Pallas -> Mosaic), which catches tile shapes and ops a backend rejects. It does not compile
to machine code: register/VMEM limits and timings still need the hardware.
"""
from unittest import mock

import jax
import jax.numpy as jnp
import pytest

from models.kernels import flash_attention as fa
from models.kernels import flash_attention_tuning as tuning_table
from models.kernels.flash_attention_tuning import KernelTuning, Tuning

TRITON_CALL = "__gpu$xla.gpu.triton"


def gradient_fn(segments: bool, window: int | None, tuning: Tuning | None):
    def loss(q, k, v, segment_ids):
        out = fa.flash_attention(q, k, v, segment_ids if segments else None, window=window, tuning=tuning,
                                 interpret=False)
        return jnp.sum(out.astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def export(platform: str, backend: str, *, segments: bool, head_dim: int, length: int, window: int | None,
           tuning: Tuning | None = None) -> str:
    q = jax.ShapeDtypeStruct((2, length, 4, head_dim), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((2, length, 2, head_dim), jnp.bfloat16)
    segment_ids = jax.ShapeDtypeStruct((2, length), jnp.int32)
    checks = [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
    with mock.patch.object(fa.jax, "default_backend", lambda: backend):
        exported = jax.export.export(gradient_fn(segments, window, tuning), platforms=[platform], disabled_checks=checks)(
            q, kv, kv, segment_ids)
    return exported.mlir_module()


CASES = [(False, 64, 256, None), (True, 128, 200, None), (True, 64, 384, 200)]  # 200 tokens: padded to 256


@pytest.mark.skipif(fa.pl_triton is None, reason="this jax has no Triton Pallas lowering")
@pytest.mark.parametrize("segments, head_dim, length, window", CASES)
def test_lowers_to_triton_for_cuda(segments, head_dim, length, window):
    module = export("cuda", "gpu", segments=segments, head_dim=head_dim, length=length, window=window)
    assert module.count(TRITON_CALL) == 3  # forward, dQ, dK/dV


@pytest.mark.parametrize("segments, head_dim, length, window", CASES)
def test_lowers_to_mosaic_for_tpu(segments, head_dim, length, window):
    tpu_info = pytest.importorskip("jax._src.pallas.mosaic.tpu_info")  # private: pretend a v5e
    with mock.patch.object(tpu_info, "get_device_kind", lambda: "TPU v5 lite"), \
            mock.patch.object(tpu_info, "get_num_device_cores", lambda: 1), \
            mock.patch.object(tpu_info, "is_tpu_device", lambda: True):
        module = export("tpu", "tpu", segments=segments, head_dim=head_dim, length=length, window=window)
    assert module.count("tpu_custom_call") == 3


def table_tunings():
    """Every distinct (tuning, head dim, dtype) of the measured table, with the length it was measured at."""
    seen = {}
    for e in tuning_table.load_table():
        seen.setdefault((Tuning.from_dict(e["tuning"]), e["head_dim"]), e["length"])
    return [pytest.param(t, d, length, id=f"D={d} T={length}") for (t, d), length in seen.items()]


@pytest.mark.skipif(fa.pl_triton is None, reason="this jax has no Triton Pallas lowering")
@pytest.mark.parametrize("tuning, head_dim, length", table_tunings() or [pytest.param(Tuning(), 64, 1024, id="defaults")])
def test_every_tuning_of_the_table_lowers_for_cuda_with_its_warps(tuning, head_dim, length):
    module = export("cuda", "gpu", segments=False, head_dim=head_dim, length=length, window=None, tuning=tuning)
    assert module.count(TRITON_CALL) == 3
    for kernel in (tuning.forward, tuning.dq, tuning.dkv):
        assert f"num_warps = {kernel.warps(head_dim)}" in module or f"num_warps={kernel.warps(head_dim)}" in module


@pytest.mark.skipif(fa.pl_triton is None, reason="this jax has no Triton Pallas lowering")
@pytest.mark.parametrize("segments, head_dim, length, window", CASES)
def test_the_fused_backward_lowers_to_two_triton_kernels_with_an_atomic_add(segments, head_dim, length, window):
    fused = Tuning(forward=KernelTuning(128, 64, 8, 3), dkv=KernelTuning(32, 128, 4, 4), backward="fused")
    module = export("cuda", "gpu", segments=segments, head_dim=head_dim, length=length, window=window, tuning=fused)
    assert module.count(TRITON_CALL) == 2  # forward, and dK/dV with dQ
