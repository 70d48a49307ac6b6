"""The train CLI as real processes (gloo collectives on CPU) against one process.

Every layout trains the numbers of one process: data parallelism (2 processes x 4 devices), tensor and
pipeline parallelism across processes, data x tensor over 2 x 2 and over 4 processes. A SIGTERM that
reaches the processes a second apart stops both at one step with one checkpoint, which resumes exactly
on 2 processes and on 1. Faults of one process: test_multihost_faults.py.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from t5x_like.checkpoint import integrity, store
from tests.support.cli import REPO, free_port, wait_for_step
from tests.support.environment import cpu_env
from tests.support.multihost import ARGS

pytestmark = pytest.mark.system

REFERENCE_STEPS = 20
LAYOUTS = {  # name: (processes, devices per process, mesh macros)
    "tensor": (2, 1, ["--gin.DATA_PARALLEL=1", "--gin.TENSOR_PARALLEL=2"]),
    "pipeline": (2, 1, ["--gin.DATA_PARALLEL=1", "--gin.PIPELINE_PARALLEL=2", "--gin.NUM_MICROBATCHES=2"]),
    # Hybrid (DCN x ICI) meshes: each process plays a node.
    "data_x_tensor_dcn": (2, 2, ["--gin.DATA_PARALLEL=2", "--gin.TENSOR_PARALLEL=2", "--gin.DCN_DATA_PARALLEL=2"]),
    "four_processes_dcn": (4, 1, ["--gin.DATA_PARALLEL=2", "--gin.TENSOR_PARALLEL=2", "--gin.DCN_DATA_PARALLEL=2",
                                  "--gin.DCN_TENSOR_PARALLEL=2"]),
}


class Job:
    """`processes` train CLIs with `devices` CPU devices each, logging to model_dir.<i>.log."""

    def __init__(self, model_dir, processes: int, devices: int, extra=()):
        self.logs = [f"{model_dir}.{i}.log" for i in range(processes)]
        port = free_port()
        self.procs = []
        for i, log in enumerate(self.logs):
            cluster = ([f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}",
                        f"--process_id={i}"] if processes > 1 else [])
            cmd = [sys.executable, "-m", "t5x_like.train", *ARGS, f"--gin.MODEL_DIR='{model_dir}'", *cluster, *extra]
            with open(log, "w") as out:
                self.procs.append(subprocess.Popen(cmd, cwd=REPO, env=cpu_env(devices), stdout=out,
                                                   stderr=subprocess.STDOUT))

    def wait(self, timeout: float = 600) -> list[int]:
        deadline = time.monotonic() + timeout
        try:
            return [p.wait(timeout=max(deadline - time.monotonic(), 0.1)) for p in self.procs]
        finally:
            for p in self.procs:
                p.kill()

    def output(self) -> list[str]:
        return [open(log).read()[-3000:] for log in self.logs]

    def run(self, timeout: float = 600) -> None:
        codes = self.wait(timeout)
        assert codes == [0] * len(codes), self.output()


def rows(model_dir) -> dict[int, dict]:
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return {row["step"]: row for row in map(json.loads, f) if "loss" in row}


def assert_same_steps(got: dict[int, dict], want: dict[int, dict], steps, rel: float = 1e-5) -> None:
    for step in steps:
        for key in ("loss", "grad_norm"):
            a, b = got[step][key], want[step][key]
            assert abs(a - b) <= rel * abs(b), (step, key, a, b)  # rel 0: bit for bit


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, dict]:
    """Data parallel over 2 processes x 1 device, REFERENCE_STEPS steps (test_two_processes_equal_one_process
    shows this layout trains the numbers of one process)."""
    model_dir = tmp_path_factory.mktemp("reference") / "run"
    Job(model_dir, 2, 1, [f"--gin.TRAIN_STEPS={REFERENCE_STEPS}", "--gin.DATA_PARALLEL=2"]).run()
    return rows(model_dir)


def test_two_processes_equal_one_process(tmp_path):
    """Data parallelism over 2 processes x 4 devices against 1 x 8, with validation and checkpoints."""
    extra = ["--gin.TRAIN_STEPS=4", "--gin.EVAL_EVERY=2", "--gin.EVAL_STEPS=1", "--gin.CHECKPOINT_EVERY=2"]
    Job(tmp_path / "single", 1, 8, extra).run()
    Job(tmp_path / "multi", 2, 4, extra).run()
    with open(tmp_path / "single" / "metrics.jsonl") as f:
        want = [json.loads(line) for line in f]
    with open(tmp_path / "multi" / "metrics.jsonl") as f:
        got = [json.loads(line) for line in f]
    assert [r["step"] for r in got] == [r["step"] for r in want]  # one writer: no duplicated rows
    for a, b in zip(got, want):
        for key in ("loss", "eval_loss", "grad_norm"):
            if key in b:
                assert abs(a[key] - b[key]) <= 1e-5 * abs(b[key]), (key, a, b)
    assert sorted(os.listdir(tmp_path / "multi" / "checkpoints")) == ["2", "4"]
    for step in ("2", "4"):  # each process checksummed the files it wrote, and only those
        step_dir = tmp_path / "multi" / "checkpoints" / step
        manifests = [json.loads((step_dir / name).read_text())["files"]
                     for name in ("checksums.json", "checksums.process_1.json")]
        assert {integrity.writer_of(f) for f in manifests[0]} == {0}
        assert {integrity.writer_of(f) for f in manifests[1]} == {1} and len(manifests[1]) >= 2
        assert store.verify_manifest(str(step_dir))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_parallel_axes_across_processes_train_the_numbers_of_one_process(tmp_path, reference, layout):
    """Processes whose devices hold the same batch rows (tensor, stage) read the same rows."""
    processes, devices, mesh = LAYOUTS[layout]
    Job(tmp_path / layout, processes, devices, ["--gin.TRAIN_STEPS=4", *mesh]).run()
    got = rows(tmp_path / layout)
    assert sorted(got) == [1, 2, 3, 4]
    assert_same_steps(got, reference, range(1, 5))


def test_a_staggered_sigterm_stops_every_process_at_one_step_and_resumes_exactly(tmp_path, reference):
    """SIGTERM to process 0, a second later to process 1: both save one checkpoint at one step and exit
    143 within 60 s; the checkpoint resumes on 2 processes bit for bit (the uninterrupted reference run has
    the same layout) and on 1 process within 1e-3 relative (steps after the stop, the summation orders
    of 2 processes and 1 device part by up to ~1e-4)."""
    run = tmp_path / "run"
    job = Job(run, 2, 1, [f"--gin.TRAIN_STEPS={REFERENCE_STEPS}", "--gin.DATA_PARALLEL=2"])
    wait_for_step(job.logs[1], 3)
    job.procs[0].send_signal(signal.SIGTERM)
    time.sleep(1.0)
    job.procs[1].send_signal(signal.SIGTERM)
    started = time.monotonic()
    codes = job.wait(timeout=60)
    assert codes == [143, 143], job.output()
    assert time.monotonic() - started < 60
    (saved,) = os.listdir(run / "checkpoints")  # one checkpoint, written by both processes together
    stopped = int(saved)
    assert 3 <= stopped < REFERENCE_STEPS, job.output()
    assert sorted(rows(run)) == list(range(1, stopped + 1))

    shutil.copytree(run, tmp_path / "on_one")
    for model_dir, processes, rel in ((run, 2, 0.0), (tmp_path / "on_one", 1, 1e-3)):
        extra = [f"--gin.TRAIN_STEPS={REFERENCE_STEPS}", f"--gin.DATA_PARALLEL={processes}"]
        Job(model_dir, processes, 1, extra).run()
        resumed = rows(model_dir)
        assert sorted(resumed) == list(range(1, REFERENCE_STEPS + 1))
        assert_same_steps(resumed, reference, range(stopped + 1, REFERENCE_STEPS + 1), rel=rel)


def test_a_batch_size_ramp_up_across_processes_trains_the_numbers_of_one_process(tmp_path):
    """BATCH_SIZE_RAMPUP over 2 processes x 1 device against 1 x 2: a ramp-up step's real rows are the first of
    the global batch, so they sit on process 0's devices alone at first; the loss and gradient are still those of
    one process, and every row of metrics.jsonl has the step's batch."""
    extra = ["--gin.TRAIN_STEPS=4", "--gin.DATA_PARALLEL=2", "--gin.BATCH_SIZE_RAMPUP=(2, 2, 12)"]
    Job(tmp_path / "single", 1, 2, extra).run()
    Job(tmp_path / "multi", 2, 1, extra).run()
    want, got = rows(tmp_path / "single"), rows(tmp_path / "multi")
    assert [got[s]["batch_size"] for s in range(1, 5)] == [want[s]["batch_size"] for s in range(1, 5)] == [2, 2, 4, 6]
    assert_same_steps(got, want, range(1, 5))
