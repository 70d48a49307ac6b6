"""Every CLI reports a user mistake as one `error: ...` line with exit status 1, no traceback."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.system

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("module, args, message", [
    ("t5x_like.data.preprocess", ["--input={tmp}", "--output_prefix={tmp}/out", "--tokenizer={tmp}"],
     "error: --input={tmp}: the directory holds no files (hidden ones are skipped)"),
    ("t5x_like.convert", ["from-hf", "{tmp}", "{tmp}/ours"], "error: {tmp}/config.json does not exist"),
    ("t5x_like.eval", ["--task=tokens", "--checkpoint={tmp}", "--data={tmp}/corpus.bin"],
     "error: --data={tmp}/corpus.bin: pass the token file's prefix, without .bin."),
    ("t5x_like.compile", ["--gin_file=quickstart.gin", "--topology=cpu:2", "--gin.RULES=fsdp"],
     "error: --gin.RULES=fsdp: 'fsdp' is not a gin value"),
])
def test_a_user_mistake_is_one_line(tmp_path, module, args, message):
    done = subprocess.run([sys.executable, "-m", module, *[a.format(tmp=tmp_path) for a in args]], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(message.format(tmp=tmp_path))


@pytest.mark.parametrize("module, expected", [
    ("t5x_like.train", "DCN_PIPELINE_PARALLEL  1"),
    ("t5x_like.compile", "--topology"),
    ("t5x_like.data.preprocess", "--output_prefix"),
    ("t5x_like.eval", "--task"),
    ("t5x_like.generate", "--checkpoint"),
    ("t5x_like.convert", "from-hf"),
])
def test_help_prints_usage_and_succeeds(module, expected):
    """Asking for help is not a failure: usage on stdout, exit status 0 (absl alone exits 1)."""
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expected in done.stdout


def test_helpfull_lists_the_libraries_flags_too():
    short, full = (subprocess.run([sys.executable, "-m", "t5x_like.train", arg], cwd=REPO, capture_output=True,
                                  text=True, timeout=300) for arg in ("--help", "--helpfull"))
    assert short.returncode == full.returncode == 0, full.stderr[-2000:]
    assert "--gin_file" in short.stdout and "--gin_file" in full.stdout
    assert "absl.logging" in full.stdout and "absl.logging" not in short.stdout
