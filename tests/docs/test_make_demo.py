"""README: "Running `make demo` again, after it finished or after you stopped it (Ctrl-C, SIGTERM), resumes from
the last checkpoint". `make demo` is interrupted with Ctrl-C (SIGINT to its process group) once a checkpoint is
written, then run again: it resumes from the checkpoint the interruption saved and finishes, every step logged
once. MODEL_DIR is relative (as the Makefile's default, runs/quickstart), and the run is made small by the
same T5X_LIKE_EXTRA_GIN mechanism as the documented commands (tests/docs/small.gin's first lines, plus a
checkpoint every few steps)."""
import json
import os
import re
import signal
import subprocess
import time

import pytest

from tests.docs.doc_commands import REPO, SMALL_GIN, command_env

pytestmark = pytest.mark.system

TRAIN_STEPS = 40  # the first run is stopped after checkpoint 10, the second finishes
DEMO_GIN = f"""{SMALL_GIN.read_text()}
TRAIN_STEPS = {TRAIN_STEPS}
CHECKPOINT_EVERY = 10
SEQ_LEN = 32
model_config.overrides = {{'num_layers': 2, 'num_heads': 4, 'embed_dim': 32, 'mlp_dim': 64}}
train.log_every = 1
"""
WRITTEN = re.compile(r"checkpoint (\d+) written")
MAKE_DEMO = ["make", "-s", "-o", ".venv/.installed-stamp", "demo"]
"""`-o`: the .venv that `make test` made counts as installed, even where setup.cfg is newer than its stamp."""


def make_demo(model_dir: str, env: dict[str, str]) -> subprocess.Popen:
    if not (REPO / ".venv" / ".installed-stamp").exists():
        pytest.skip("make demo needs the .venv that `make test` creates")
    return subprocess.Popen(MAKE_DEMO + [f"MODEL_DIR={model_dir}"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def read_until(process: subprocess.Popen, pattern: re.Pattern, timeout: float) -> tuple[list[str], re.Match | None]:
    lines, deadline = [], time.monotonic() + timeout
    for line in process.stdout:
        lines.append(line)
        if (match := pattern.search(line)) or time.monotonic() > deadline:
            return lines, match
    return lines, None


def test_interrupted_make_demo_resumes_where_it_stopped(tmp_path):
    (tmp_path / "demo.gin").write_text(DEMO_GIN)
    env = command_env(tmp_path / "jax_cache")  # the doc-command tests' environment (tests/docs/doc_commands.py)
    env["T5X_LIKE_EXTRA_GIN"] = str(tmp_path / "demo.gin")
    model_dir = os.path.relpath(tmp_path / "runs" / "qs", REPO)  # relative to the checkout, where make runs
    assert not model_dir.startswith("/")

    first = make_demo(model_dir, env)
    try:
        lines, written = read_until(first, WRITTEN, timeout=240)
        assert written, "no checkpoint was written:\n" + "".join(lines[-40:])
        os.killpg(first.pid, signal.SIGINT)  # Ctrl-C in the terminal reaches make and python alike
        rest, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    log = "".join(lines) + rest
    assert first.returncode != 0 and "received signal 2" in log, log[-3000:]
    steps = sorted(int(p.name) for p in (tmp_path / "runs" / "qs" / "checkpoints").iterdir() if p.name.isdigit())
    stopped_at = steps[-1]
    assert int(written[1]) <= stopped_at < TRAIN_STEPS, (steps, log[-3000:])

    second = subprocess.run(MAKE_DEMO + [f"MODEL_DIR={model_dir}"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=280)
    again = second.stdout + second.stderr
    assert second.returncode == 0, again[-3000:]
    assert re.search(rf"resumed from \S+ at step {stopped_at}\b", again), again[-3000:]
    assert f"done: step {TRAIN_STEPS}/{TRAIN_STEPS}" in again, again[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "runs" / "qs" / "metrics.jsonl").read_text().splitlines()]
    logged = [row["step"] for row in rows if "loss" in row]
    assert logged == list(range(1, TRAIN_STEPS + 1)), "every step logged once, in order, across the interruption"
