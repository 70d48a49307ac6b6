"""The train CLI as two real processes x 4 CPU devices (gloo) equals one process x 8 devices."""
import json
import os
import socket
import subprocess
import sys
from tests.conftest import cpu_env

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ARGS = ["--gin_file=quickstart.gin", "--gin.TRAIN_STEPS=4", "--gin.WARMUP_STEPS=1", "--gin.BATCH_SIZE=8",
        "--gin.SEQ_LEN=32", "--gin.EVAL_EVERY=2", "--gin.EVAL_STEPS=1", "--gin.CHECKPOINT_EVERY=2",
        "--gin.train.log_every=1",
        "--gin.model_config.overrides={'num_layers': 2, 'dropout_rate': 0.0, 'attention_dropout_rate': 0.0}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(model_dir, devices: int, log, extra=()) -> subprocess.Popen:
    env = cpu_env(devices)
    cmd = [sys.executable, "-m", "t5x_like.train", *ARGS, f"--gin.MODEL_DIR='{model_dir}'", *extra]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def rows(model_dir):
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_two_processes_equal_one_process(tmp_path):
    single = tmp_path / "single"
    with open(tmp_path / "single.log", "w") as log:
        assert launch(single, 8, log).wait(timeout=600) == 0, (tmp_path / "single.log").read_text()[-3000:]

    multi = tmp_path / "multi"
    port = free_port()
    logs = [open(tmp_path / f"multi{i}.log", "w") for i in range(2)]
    procs = [launch(multi, 4, logs[i], ["--coordinator_address", f"127.0.0.1:{port}", "--num_processes=2",
                                        f"--process_id={i}"]) for i in range(2)]
    try:
        codes = [p.wait(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
        for log in logs:
            log.close()
    assert codes == [0, 0], [(tmp_path / f"multi{i}.log").read_text()[-3000:] for i in range(2)]

    want, got = rows(single), rows(multi)
    assert [r["step"] for r in got] == [r["step"] for r in want]  # one writer: no duplicated rows
    for a, b in zip(got, want):
        for key in ("loss", "eval_loss", "grad_norm"):
            if key in b:
                assert abs(a[key] - b[key]) <= 1e-5 * abs(b[key]), (key, a, b)
    assert sorted(os.listdir(multi / "checkpoints")) == ["2", "4"]
