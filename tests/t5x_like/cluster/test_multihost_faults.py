"""Faults of one process in a two-process train job (real processes, gloo over 127.0.0.1): every process
stops within seconds, and its last line names the process and the fault (t5x_like/cluster/agreement.py).

The multi-process cases of the bad-input sweep (tests/t5x_like/test_errors_every_cli.py holds the single-process
ones): a configuration error on one process, processes given different settings, a process that never
starts (either one), a killed process (either one). tests/t5x_like/cluster/test_processes.py adds a hung process
(SIGSTOP) and kills in the middle of a collective without the trainer.
"""
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support.cli import free_port, wait_for_step
from tests.support.environment import cpu_env
from tests.support.multihost import ARGS

pytestmark = pytest.mark.system

HEARTBEAT_S = 10
C_ABORT = ("Check failure stack trace", "Fatal Python error", "Traceback")


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> dict[str, str]:
    """jax's persistent compilation cache, shared by the jobs of one layout: one compiles, the next reads."""
    return {"JAX_COMPILATION_CACHE_DIR": str(tmp_path_factory.mktemp("jax_cache")),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


class Processes:
    """Train CLIs of a 2-process job, process i with ARGS + per_process[i]; None = never started."""

    def __init__(self, tmp_path, per_process: list[list[str] | None], **env: str):
        port = free_port()
        self.logs = [tmp_path / f"process{i}.log" for i in range(len(per_process))]
        self.procs: list[subprocess.Popen | None] = []
        self.started = time.monotonic()
        for i, extra in enumerate(per_process):
            if extra is None:
                self.procs.append(None)
                continue
            cmd = [sys.executable, "-m", "t5x_like.train", *ARGS, "--gin.MODEL_DIR='run'", "--gin.DATA_PARALLEL=2",
                   f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={len(per_process)}",
                   f"--process_id={i}", f"--heartbeat_timeout_seconds={HEARTBEAT_S}", *extra]
            with open(self.logs[i], "w") as out:
                self.procs.append(subprocess.Popen(cmd, cwd=tmp_path, env=cpu_env(1, **env), stdout=out,
                                                   stderr=subprocess.STDOUT))

    def wait(self, timeout: float) -> dict[int, tuple[int, float]]:
        """{process: (exit code, seconds since start)} for the started processes; all killed afterwards."""
        deadline, ended = time.monotonic() + timeout, {}
        try:
            while len(ended) < sum(p is not None for p in self.procs) and time.monotonic() < deadline:
                for i, proc in enumerate(self.procs):
                    if proc is not None and i not in ended and proc.poll() is not None:
                        ended[i] = (proc.returncode, time.monotonic() - self.started)
                time.sleep(0.1)
        finally:
            for proc in self.procs:
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
        return ended

    def log(self, i: int) -> str:
        return self.logs[i].read_text()

    def last_line(self, i: int) -> str:
        return self.log(i).strip().splitlines()[-1]


def test_a_configuration_error_on_one_process_stops_both_and_process_0_names_it(tmp_path):
    """A node without the data mount: process 1's DATA_PATH does not exist. It stops with its error; process 0,
    which would wait at the first collective, stops too, naming process 1 and its error; both within
    seconds of the error, process 0 after its usual clean-up (no run.lock left)."""
    job = Processes(tmp_path, [["--gin.TRAIN_STEPS=5"], ["--gin.TRAIN_STEPS=5", "--gin.DATA_PATH='missing/corpus'"]])
    ended = job.wait(timeout=120)
    assert ended.get(0, (None,))[0] == 1 and ended.get(1, (None,))[0] == 1, (ended, job.log(0), job.log(1))
    assert ended[0][1] - ended[1][1] < 15, ended  # process 0 goes within seconds of process 1's error
    assert job.last_line(1).startswith("error: missing/corpus") and "missing" in job.last_line(1), job.log(1)
    assert job.last_line(0) == "error: process 1 failed: " + job.last_line(1).removeprefix("error: "), job.log(0)
    for i in (0, 1):
        assert "step 1/" not in job.log(i) and not any(text in job.log(i) for text in C_ABORT), job.log(i)
    assert not os.path.exists(tmp_path / "run" / "run.lock")


def test_processes_given_different_train_steps_are_refused_before_step_1(tmp_path):
    job = Processes(tmp_path, [["--gin.TRAIN_STEPS=20"], ["--gin.TRAIN_STEPS=30"]])
    ended = job.wait(timeout=120)
    assert [ended.get(i, (None,))[0] for i in (0, 1)] == [1, 1], (ended, job.log(0), job.log(1))
    named = "TRAIN_STEPS is 30 on process 1 but 20 on process 0"
    assert job.last_line(1).startswith("error: the processes were given different settings: " + named), job.log(1)
    assert job.last_line(0).startswith("error: process 1 failed: the processes were given different settings: "
                                       + named), job.log(0)
    for i in (0, 1):
        assert "step 1/" not in job.log(i) and not any(text in job.log(i) for text in C_ABORT), job.log(i)
    assert not os.path.exists(tmp_path / "run" / "checkpoints")


def test_a_process_that_never_starts_is_named_within_the_initialization_timeout(tmp_path):
    """Process 0 alone, then process 1 alone (its coordinator never starts), each with a 5 s timeout."""
    timeout = ["--gin.TRAIN_STEPS=5", "--initialization_timeout_seconds=5"]
    for folder in ("p0", "p1"):
        (tmp_path / folder).mkdir()
    alone = {0: Processes(tmp_path / "p0", [timeout, None]), 1: Processes(tmp_path / "p1", [None, timeout])}
    missing = {0: "error: process 0: process 1 did not connect within 5 s",
               1: "error: process 1: process 0 (the coordinator at 127.0.0.1:"}
    for i, job in alone.items():
        ((code, seconds),) = job.wait(timeout=60).values()
        assert code == 1 and seconds < 5 + 25, (seconds, job.log(i))  # 5 s, after imports and start-up
        assert job.last_line(i).startswith(missing[i]), job.log(i)
        assert "raise --initialization_timeout_seconds (now 5)" in job.last_line(i)
        assert not any(text in job.log(i) for text in C_ABORT), job.log(i)


@pytest.mark.parametrize("victim, named", [
    (1, "error: process 1 died: its connection to process 0 closed (killed, crashed or out of memory"),
    (0, "error: process 0 (the coordinator, 127.0.0.1:"),
], ids=["process_1_killed", "process_0_killed"])
def test_a_killed_process_is_named_by_the_survivor(tmp_path, compile_cache, victim, named):
    """SIGKILL in the middle of training: the survivor's last line names the dead process within seconds
    (well inside the heartbeat timeout), with neither jax's C++ abort nor a traceback."""
    job = Processes(tmp_path, [["--gin.TRAIN_STEPS=100000"]] * 2, **compile_cache)
    survivor = 1 - victim
    wait_for_step(str(job.logs[survivor]), 2)
    job.procs[victim].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    job.started = killed
    ended = job.wait(timeout=HEARTBEAT_S + 20)
    code, seconds = ended.get(survivor, (None, None))
    assert code == 1, (ended, job.log(survivor))
    assert seconds < HEARTBEAT_S, (seconds, job.log(survivor))
    assert job.last_line(survivor).startswith(named), job.log(survivor)
    assert not any(text in job.log(survivor) for text in C_ABORT), job.log(survivor)
