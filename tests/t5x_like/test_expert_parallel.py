"""gin/quickstart_mixtral.gin as a user runs it (the train CLI from a folder of its own): the same losses on one
device as with the experts split four ways (EXPERT_PARALLEL=4) beside tensor parallelism on 8 devices,
and across two processes (gloo) with the experts split between them, the parameter layout putting the experts'
weights on the 'expert' mesh axis, and the router's losses logged."""
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.support.cli import free_port, run_cli
from tests.support.environment import cpu_env

pytestmark = pytest.mark.system
SHORT = ["--gin_file=quickstart_mixtral.gin", "--gin.TRAIN_STEPS=3", "--gin.BATCH_SIZE=8", "--gin.SEQ_LEN=32",
         "--gin.EVAL_EVERY=0", "--gin.CHECKPOINT_EVERY=3", "--gin.WARMUP_STEPS=1", "--gin.train.log_every=1"]
LAYOUTS = {"one device": (1, []),
           "EXPERT_PARALLEL=4 x TENSOR_PARALLEL=2": (8, ["--gin.EXPERT_PARALLEL=4", "--gin.DATA_PARALLEL=1",
                                                         "--gin.TENSOR_PARALLEL=2"])}
"""The CLI's layouts (the macros, the layout table, the router's metrics); the experts split beside data
parallelism is the family x mesh table's row (tests/t5x_like/test_every_family.py, mixtral expert=4,data=2) and
the two-process test's below."""


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def layout_row(log: str, parameter: str) -> str:
    """The parameter layout's line for this parameter (the train log's table)."""
    return next(line for line in log.splitlines() if line.strip().startswith(parameter))


@pytest.fixture(scope="module")
def one_device(tmp_path_factory) -> list[dict]:
    """The quickstart's rows on one device (the reference of every layout here)."""
    folder = tmp_path_factory.mktemp("one_device")
    run_cli("t5x_like.train", [*SHORT, "--gin.MODEL_DIR='run'"], folder, devices=1, timeout=600)
    return rows(folder / "run")


def test_quickstart_mixtral_trains_the_same_losses_with_the_experts_split_over_devices(tmp_path, one_device):
    """float32, dropless routing: losses within 1e-5 relative (only the order of reductions differs)."""
    runs = {"one device": (one_device, "")}
    for index, (name, (devices, args)) in enumerate(list(LAYOUTS.items())[1:]):
        folder = tmp_path / f"layout{index}"
        folder.mkdir()
        done = run_cli("t5x_like.train", [*SHORT, "--gin.MODEL_DIR='run'", *args], folder, devices=devices,
                       timeout=600)
        runs[name] = (rows(folder / "run"), done.stderr)
    want, _ = runs["one device"]
    assert [row["step"] for row in want] == [1, 2, 3]
    for row in want:
        assert row["load_balancing_loss"] > 0 and row["router_z_loss"] > 0
        np.testing.assert_allclose(sum(row[f"expert_share/{e}"] for e in range(4)), 1.0, rtol=1e-6)
    for name in list(LAYOUTS)[1:]:
        got, log = runs[name]
        for key in ("loss", "load_balancing_loss", "grad_norm"):
            np.testing.assert_allclose([r[key] for r in got], [r[key] for r in want], rtol=1e-5 if key == "loss"
                                       else 1e-4, err_msg=f"{name}: {key}")
        assert "'expert': 4" in log
        for kernel in ("gate_kernel", "fc_kernel", "proj_kernel"):  # logical axes, then the mesh axes they take
            row = layout_row(log, f"blocks/mlp/{kernel}").split("  ")
            assert "('layers', 'expert'," in row[-3] + row[-2] and row[-1].startswith("('stage', 'expert',"), row


def test_the_experts_split_across_two_processes_train_one_devices_losses(tmp_path, one_device):
    """2 processes x 4 devices, EXPERT_PARALLEL=4 with 2 of its ways between the processes (DCN_EXPERT_PARALLEL)
    x DATA_PARALLEL=2: each process holds half of each layer's experts; the losses are one device's (1e-5)."""
    port, procs = free_port(), []
    for index in (0, 1):
        folder = tmp_path / f"process{index}"
        folder.mkdir()
        args = [*SHORT, f"--gin.MODEL_DIR='{tmp_path / 'run'}'", "--gin.EXPERT_PARALLEL=4", "--gin.DATA_PARALLEL=2",
                "--gin.DCN_EXPERT_PARALLEL=2", f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
                f"--process_id={index}"]
        procs.append(subprocess.Popen([sys.executable, "-m", "t5x_like.train", *args], cwd=folder, env=cpu_env(4),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [p.communicate(timeout=600)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], [out[-3000:] for out in outputs]
    got, want = rows(tmp_path / "run"), one_device
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=1e-5)
    np.testing.assert_allclose([r["load_balancing_loss"] for r in got], [r["load_balancing_loss"] for r in want],
                               rtol=1e-4)
