"""eval and generate as two real processes (gloo on CPU, the model's tensor axis across them) give the
numbers and completions of one process, and only process 0 writes."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cli import REPO, free_port
from tests.support.environment import cpu_env
from tests.support.shared_data import shared_file

pytestmark = pytest.mark.system



@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, random_hf_gpt2):
    bpe, wikitext = shared_file("gpt2-bpe"), shared_file("wikitext", "wt103-tokenized", "wiki.test.tokens")
    from t5x_like.convert import hf

    path = tmp_path_factory.mktemp("model")
    random_hf_gpt2(0.3).save_pretrained(path / "hf")
    shutil.copyfile(bpe / "encoder.json", path / "hf" / "vocab.json")
    shutil.copyfile(bpe / "vocab.bpe", path / "hf" / "merges.txt")
    hf.from_hf(str(path / "hf"), str(path / "ours"), scan_layers=False)
    lines = wikitext.read_text(encoding="utf-8").splitlines(keepends=True)[:10]
    (path / "excerpt.txt").write_text("".join(lines), encoding="utf-8")
    return path


def run_cli(module: str, args: list[str], out: Path, processes: int) -> list[str]:
    """Run `python -m module args --output=out` as `processes` processes (tensor parallel 2 in all);
    returns each process's stdout."""
    port, procs = free_port(), []
    for i in range(processes):
        cluster = ([f"--coordinator_address=127.0.0.1:{port}", f"--num_processes={processes}", f"--process_id={i}"]
                   if processes > 1 else [])
        procs.append(subprocess.Popen(
            [sys.executable, "-m", module, *args, "--tensor_parallel=2", f"--output={out}", *cluster],
            cwd=REPO, env=cpu_env(2 // processes), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0] * processes, [err[-3000:] for _, err in results]
    # gloo (jax's CPU collectives, first used by the checkpoint's cross-process checksum check) announces its
    # connections on stdout itself: that is the library's line, not one the CLI printed
    return ["".join(line for line in stdout.splitlines(keepends=True) if not line.startswith("[Gloo]"))
            for stdout, _ in results]


def test_wikitext_eval_on_two_processes_equals_one(checkpoint, tmp_path):
    args = ["--task=wikitext", f"--checkpoint={checkpoint / 'ours'}", f"--data={checkpoint / 'excerpt.txt'}",
            "--seq_len=32", "--stride=16", "--batch_size=4"]
    one = run_cli("t5x_like.eval", args, tmp_path / "one.json", 1)
    two = run_cli("t5x_like.eval", args, tmp_path / "two.json", 2)
    want, got = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert got["num_tokenized_tokens"] == want["num_tokenized_tokens"] > 100
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert "ppl" in two[0] and two[1] == "" and "ppl" in one[0]  # process 1 prints nothing


def test_generate_on_two_processes_equals_one(checkpoint, tmp_path):
    args = [f"--checkpoint={checkpoint / 'ours'}", "--prompt=The city of", "--prompt=In 1990 the band",
            "--max_new_tokens=8", "--temperature=0", "--batch_size=2"]
    run_cli("t5x_like.generate", args, tmp_path / "one.jsonl", 1)
    run_cli("t5x_like.generate", args, tmp_path / "two.jsonl", 2)
    want, got = ([json.loads(line) for line in (tmp_path / f"{n}.jsonl").read_text().splitlines()]
                 for n in ("one", "two"))
    assert got == want and len(got) == 2 and all(r["tokens"] for r in got)
