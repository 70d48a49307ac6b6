"""Running the project's CLIs as users do, in processes of their own: the repository they run from, a CLI run
and checked, a free port for a multi-process job's coordinator, and waiting for a run's log to reach a step."""
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.environment import cpu_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_cli(module: str, args: list[str], cwd: Path, devices: int = 8, timeout: int = 300, *,
            optimized: bool = False) -> subprocess.CompletedProcess:
    """`python -m module args` in `cwd` with `devices` simulated CPU devices (the suite's XLA flags, or XLA's full
    optimisation with `optimized`: environment.cpu_env); it must exit 0 (else the end of its stderr is the failure)."""
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=cpu_env(devices, optimized=optimized),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def train_tokenizer(*args) -> subprocess.CompletedProcess:
    """`python -m t5x_like.data.train_tokenizer args` from the repository, however it exits."""
    return subprocess.run([sys.executable, "-m", "t5x_like.data.train_tokenizer", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_step(log: str, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while f"step {step}/" not in open(log).read():
        assert time.monotonic() < deadline, open(log).read()[-3000:]
        time.sleep(0.2)
