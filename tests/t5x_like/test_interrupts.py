"""Issue 46: Ctrl-C during a multi-worker preprocess or an eval. A terminal's Ctrl-C signals the whole foreground
process group (the CLI and its workers); before, every process printed a KeyboardInterrupt traceback. Now the CLI
ends with one line and status 130 (a shell's for Ctrl-C), its workers quietly, and nothing half-written is left."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.support.environment import cpu_env
from tests.support.shared_data import shared_file

pytestmark = pytest.mark.system

LINE = "interrupted (Ctrl-C): stopped before finishing; nothing half-written is left"


def answer_ctrl_c() -> None:
    """In the CLI's process before Python starts: Ctrl-C's default action, as a terminal's foreground command has it.
    A suite started in the background (`make test &`) ignores SIGINT, and its children would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Running:
    """A CLI started in its own process group, its stderr gathered as it comes."""

    def __init__(self, argv: list[str], cwd):
        self.process = subprocess.Popen([sys.executable, "-m", *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True, env=cpu_env(1),
                                        preexec_fn=answer_ctrl_c)
        self.stderr = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for chunk in iter(lambda: self.process.stderr.read(64), ""):
            self.stderr += chunk

    def wait_for(self, done, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert self.process.poll() is None, f"ended before the interrupt: {self.stderr[-2000:]}"
            assert time.monotonic() < deadline, f"never got there: {self.stderr[-2000:]}"
            time.sleep(0.05)

    def ctrl_c(self) -> int:
        os.killpg(self.process.pid, signal.SIGINT)
        status = self.process.wait(timeout=60)
        self._reader.join(timeout=10)
        return status


def test_ctrl_c_during_a_preprocess_with_workers_is_one_line_and_leaves_no_file(tmp_path):
    tokenizer = str(shared_file("gpt2-bpe"))
    with open(tmp_path / "corpus.jsonl", "w") as f:
        for i in range(600_000):
            f.write(json.dumps({"text": f"document {i} says something about the number {i * 7919 % 10007}."}) + "\n")
    (tmp_path / "out").mkdir()
    running = Running(["t5x_like.data.preprocess", "--input=corpus.jsonl", "--output_prefix=out/corpus",
                       f"--tokenizer={tokenizer}", "--workers=2"], tmp_path)
    running.wait_for(lambda: re.search(r"[1-9]\d* docs \[", running.stderr))  # the workers' first documents written
    assert running.ctrl_c() == 130, running.stderr[-3000:]
    assert running.stderr.rstrip().endswith(LINE) and "Traceback" not in running.stderr, running.stderr[-3000:]
    assert os.listdir(tmp_path / "out") == []


def test_ctrl_c_during_an_eval_is_one_line_and_writes_no_result(tmp_path):
    (tmp_path / "text.txt").write_text(" = Heading = \n" + "the river runs past the old mill and on to the sea . " * 20_000)
    done = subprocess.run([sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin",
                           "--gin.MODEL_DIR='run'", "--gin.TRAIN_STEPS=1", "--gin.WARMUP_STEPS=0",
                           "--gin.optim.make_optimizer.decay='constant'", "--gin.EVAL_EVERY=0",
                           "--gin.model_config.overrides={'num_layers': 1, 'embed_dim': 32, 'num_heads': 2, "
                           "'mlp_dim': 64}"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=cpu_env(1))
    assert done.returncode == 0, done.stderr[-3000:]
    running = Running(["t5x_like.eval", "--task=wikitext", "--checkpoint=run", "--data=text.txt", "--seq_len=32",
                       "--output=eval.json"], tmp_path)
    running.wait_for(lambda: "wikitext:" in running.stderr)  # scoring
    assert running.ctrl_c() == 130, running.stderr[-3000:]
    assert running.stderr.rstrip().endswith(LINE) and "Traceback" not in running.stderr, running.stderr[-3000:]
    assert not (tmp_path / "eval.json").exists()
