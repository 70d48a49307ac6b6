"""The AOT compile tool: its memory figures against a real CPU run, 1/fsdp scaling of the state,
the early does-not-fit error, and the CLI (8 simulated CPU devices)."""
import json
import os
import subprocess
import sys
import threading
import time

import gin
import jax
import pytest

from t5x_like import compile as compile_tool
from t5x_like.config import frontend
from t5x_like.errors import UserError
from t5x_like.experiment import build_experiment

BATCH, SEQ_LEN = 32, 128
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def quickstart():
    """Parse quickstart.gin (GPT-2 tiny, fp32) with extra bindings, as the CLI does: the run's settings."""
    def parse(*bindings):
        gin.clear_config()
        return frontend.parse_gin(["quickstart.gin"], [*compile_tool.UNUSED_MACROS, f"BATCH_SIZE={BATCH}",
                                              f"SEQ_LEN={SEQ_LEN}", *bindings], [])
    yield parse
    gin.clear_config()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_growth(fn) -> int:
    """How far this process's resident memory rises above its level before `fn()` while it runs."""
    base, peak, done = rss_bytes(), [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_bytes() - base)
            time.sleep(0.0005)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return peak[0]


@pytest.mark.integration
def test_report_matches_what_a_cpu_run_allocates(quickstart, synthetic_source):
    """The state on device 0 is exactly state_bytes_per_device; a step's resident-memory rise, per
    device, is temp_bytes_per_device within a factor of 1.5 (measured: 1.00)."""
    settings = quickstart("FSDP_PARALLEL=2")
    devices = jax.devices()
    report, step = compile_tool.compile_step(devices, None, settings)
    exp = build_experiment(settings.experiment, train_steps=settings.loop.train_steps,
                           mesh=compile_tool.mesh_for(devices, settings))
    state, num_params = exp.init_state(), exp.num_params
    with exp.partitioner.activate():
        on_device_0 = sum(shard.data.nbytes for x in jax.tree.leaves(state) for shard in x.addressable_shards
                          if shard.device == devices[0])
        source = synthetic_source("train", batch_size=BATCH, feature_lengths={"targets": SEQ_LEN}, seed=0, shard_index=0, shard_count=1)
        batch = exp.global_batch(next(source))
        state, _ = step(state, batch)
        growth = []
        for _ in range(3):  # the allocator sometimes reuses pages it kept from the step before
            def one_step():
                nonlocal state
                state, metrics = step(state, batch)
                jax.block_until_ready(metrics)
            growth.append(peak_rss_growth(one_step) / len(devices))
    assert report["num_params"] == num_params
    assert report["state_bytes_per_device"] == on_device_0
    assert report["argument_bytes_per_device"] - on_device_0 == 3 * 4 * (BATCH // 8) * SEQ_LEN  # + the batch
    assert 1 / 1.5 < max(growth) / report["temp_bytes_per_device"] < 1.5
    assert report["total_bytes_per_device"] >= report["argument_bytes_per_device"] + report["temp_bytes_per_device"]


@pytest.mark.system
def test_cli_report_and_state_bytes_shrink_as_one_over_fsdp(quickstart, tmp_path):
    fsdp2, _ = compile_tool.compile_step(jax.devices(), None, quickstart("FSDP_PARALLEL=2"))
    output = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "t5x_like.compile", "--gin_file=quickstart.gin", "--topology=cpu:8",
                           f"--gin.BATCH_SIZE={BATCH}", f"--gin.SEQ_LEN={SEQ_LEN}", "--gin.FSDP_PARALLEL=8",
                           f"--output={output}"], cwd=ROOT, check=True, capture_output=True, text=True)
    fsdp8 = json.loads(output.read_text())
    gib = lambda key: f"{fsdp8[key] / (1 << 30):.2f} GiB"  # noqa: E731
    assert f"  train state      {gib('state_bytes_per_device')}\n" in done.stdout
    assert f"  total            {gib('total_bytes_per_device')} of unknown\n" in done.stdout
    assert "5,322,240 parameters" in done.stdout and '"num_params"' not in done.stdout  # a summary, not JSON
    assert fsdp8["mesh"] == {"data": 1, "stage": 1, "fsdp": 8, "expert": 1, "tensor": 1} and fsdp8["topology"] == "cpu:8"
    assert fsdp8["num_params"] == fsdp2["num_params"] == 5_322_240
    for key in ("state_bytes_per_device", "argument_bytes_per_device"):
        assert fsdp2[key] / fsdp8[key] == pytest.approx(4, rel=0.01), key


def test_a_state_that_does_not_fit_fails_before_compiling(quickstart, monkeypatch):
    settings = quickstart("FSDP_PARALLEL=8")
    monkeypatch.setattr(compile_tool, "compile_or_explain", lambda *a: pytest.fail("compiled although it cannot fit"))
    with pytest.raises(compile_tool.DoesNotFit, match=r"needs 0.01 GiB per device but a device has 0.00 GiB.*"
                                                      "FSDP_PARALLEL"):
        compile_tool.compile_step(jax.devices(), 1 << 20, settings)


def test_tpu_topology_compiles_without_tpus(quickstart):
    pytest.importorskip("libtpu", reason="needs libtpu (pip install 'jax[tpu]')")
    devices = compile_tool.target_devices("v5e:2x2")
    settings = quickstart("FSDP_PARALLEL=4")
    report, _ = compile_tool.compile_step(devices, compile_tool.device_memory(devices, None), settings)
    assert report["device_kind"] == "TPU v5 lite" and report["device_memory_bytes"] == 16 << 30
    assert report["fits"] and report["state_bytes_per_device"] < report["argument_bytes_per_device"]
    assert report["step_seconds_at_peak"] == pytest.approx(report["analytic_flops_per_step"] / (4 * 197e12))


def test_two_tpu_slices_compile_with_a_dcn_data_axis(quickstart):
    """Two v5p:2x2x1 slices (8 chips) joined by DCN_DATA_PARALLEL=2: a hybrid mesh whose halves are the
    slices; a DCN layout that does not match the slices is one error naming the macro."""
    pytest.importorskip("libtpu", reason="needs libtpu (pip install 'jax[tpu]')")
    from partitioning import make_mesh

    devices = compile_tool.target_devices("v5p:2x2x1", num_slices=2)
    assert len(devices) == 8 and {d.slice_index for d in devices} == {0, 1}
    mesh = make_mesh(data=8, dcn_data=2, devices=devices)
    assert {d.slice_index for d in mesh.devices[:4].flat} == {0} and {d.slice_index for d in mesh.devices[4:].flat} == {1}
    with pytest.raises(UserError, match="DCN_DATA_PARALLEL=4 multiply to 4, but the devices form 2 slices"):
        make_mesh(data=8, dcn_data=4, devices=devices)
    settings = quickstart("DATA_PARALLEL=8", "DCN_DATA_PARALLEL=2")
    report, _ = compile_tool.compile_step(devices, compile_tool.device_memory(devices, None), settings)
    assert report["devices"] == 8 and report["fits"]


@pytest.mark.system
def test_help_lists_the_gin_flags():
    done = subprocess.run([sys.executable, "-m", "t5x_like.compile", "--help"], cwd=ROOT, capture_output=True,
                          text=True)
    for flag in ("--gin_file", "--gin_bindings", "--topology", "--output"):
        assert flag in done.stdout, flag
