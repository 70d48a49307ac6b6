"""train_tokenizer on a corpus too small for the asked size: a clear message, not a crash or silence."""
import json

import numpy as np
import pytest

from tests.support.cli import train_tokenizer

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """~2,000 lines of words drawn from a 300-word vocabulary (far fewer than 32000 pieces)."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 9))) for _ in range(300)]
    lines = [" ".join(rng.choice(words, rng.integers(5, 15))) for _ in range(2000)]
    directory = tmp_path_factory.mktemp("corpus")
    (directory / "part0.txt").write_text("\n".join(lines) + "\n")
    return directory


def test_sentencepiece_too_large_names_the_largest_size(small_corpus, tmp_path):
    done = train_tokenizer(f"--input={small_corpus}", "--type=sentencepiece", f"--output={tmp_path / 'sp.model'}",
                           "--vocab_size=32000")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    message = done.stderr.strip().splitlines()[-1]
    assert message.startswith("error: --vocab_size=32000: this corpus yields at most ")
    largest = int(message.split("at most ")[1].split()[0])
    assert 300 < largest < 32000


def test_bpe_says_when_it_has_fewer_ids_than_asked(small_corpus, tmp_path):
    output = tmp_path / "tok.json"
    done = train_tokenizer(f"--input={small_corpus}", f"--output={output}", "--vocab_size=32000")
    assert done.returncode == 0, done.stderr[-2000:]
    size = len(json.loads(output.read_text())["model"]["vocab"])
    assert f"bpe, {size} ids" in done.stdout and size < 32000
    assert "note: fewer ids than --vocab_size=32000" in done.stdout and f"vocab_size >= {size}" in done.stdout


def test_an_empty_input_directory_is_reported_as_empty(tmp_path):
    (tmp_path / "empty").mkdir()
    done = train_tokenizer(f"--input={tmp_path / 'empty'}", f"--output={tmp_path / 'tok.json'}")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"error: --input={tmp_path / 'empty'}: the directory holds no " \
                                                   "files (hidden ones are skipped)"


@pytest.mark.parametrize("kind, became", [
    ("sentencepiece", "have no piece of their own: the model encodes each as the byte piece <0x00>"),
    ("wordpiece", "were dropped by BERT's normaliser, as it drops them when it encodes")])
def test_nul_characters_are_warned_naming_the_file_and_line(small_corpus, tmp_path, kind, became):
    """sentencepiece logged its 'Found null character' below its log level and trained on; now one line names the
    first NUL's file and line and what became of them (a JSON line's \\u0000 escape counts too)."""
    (tmp_path / "corpus.txt").write_text((small_corpus / "part0.txt").read_text())
    (tmp_path / "more.jsonl").write_text('{"text": "clean"}\n{"text": "a\\u0000b"}\n{"text": "c\\u0000"}\n')
    output = tmp_path / ("tok.model" if kind == "sentencepiece" else "vocab.txt")
    done = train_tokenizer(f"--input={tmp_path / 'corpus.txt'},{tmp_path / 'more.jsonl'}", f"--type={kind}",
                           f"--output={output}", "--vocab_size=400")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[1] == (
        f"warning: {tmp_path / 'more.jsonl'}:2: 2 NUL characters (U+0000) in 2 documents (the first here) {became}; "
        "a binary or UTF-16 file among the inputs? Remove them from the corpus if unintended")
