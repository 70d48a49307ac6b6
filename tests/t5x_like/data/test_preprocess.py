"""preprocess and train_tokenizer: library functions and the two command lines."""
import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from t5x_like.data import SourceSettings, load_tokenizer, make_source, open_token_file
from t5x_like.data.formats import InputError
from t5x_like.data.preprocess import preprocess
from t5x_like.data.tokenizer_files import recorded_tokenizer_path
from t5x_like.data.train_tokenizer import train_byte_level_bpe, train_sentencepiece
from t5x_like.features import DECODER_INPUT_TOKENS

TEXTS = [f"Document {i}: the quick brown fox jumps over {i % 7} lazy dogs. " * (1 + i % 5) for i in range(300)]


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_byte_level_bpe(TEXTS, 400).save(str(path))
    return str(path)


@pytest.fixture
def corpus(tmp_path):
    """TEXTS spread over a gzipped JSON-lines file, a JSON array and a directory of text files."""
    with gzip.open(tmp_path / "a.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in TEXTS[:100])
    (tmp_path / "b.json").write_text(json.dumps(TEXTS[100:200]))
    (tmp_path / "c").mkdir()
    for i, text in enumerate(TEXTS[200:]):
        (tmp_path / "c" / f"{i:03d}.txt").write_text(text)
    return [str(tmp_path / "a.jsonl.gz"), str(tmp_path / "b.json"), str(tmp_path / "c")]


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.system
def test_token_file_holds_each_document_with_eod_in_input_order(tmp_path, corpus, tokenizer_path, workers):
    summary = preprocess(corpus, str(tmp_path / "out" / "p"), tokenizer_path, workers=workers)
    tokenizer = load_tokenizer(tokenizer_path)
    tokens = open_token_file(tmp_path / "out" / "p")
    assert tokens.num_documents == summary["num_documents"] == 300
    assert [tokens.document(i).tolist() for i in range(300)] == [tokenizer.encode(t) + [0] for t in TEXTS]
    recorded = tokens.metadata["tokenizer"]
    assert {k: recorded[k] for k in ("path", "sha256", "vocab_size", "eod_id")} == {
        "path": tokenizer_path, "sha256": tokenizer.sha256, "vocab_size": 400, "eod_id": 0}
    assert load_tokenizer(recorded_tokenizer_path(recorded)).sha256 == tokenizer.sha256  # the files travel with it
    assert tokens.metadata["sources"][:2] == corpus[:2] and len(tokens.metadata["sources"]) == 102
    assert tokens.tokens.dtype == np.uint16


@pytest.mark.system
def test_without_eod(tmp_path, corpus, tokenizer_path):
    preprocess(corpus[:1], str(tmp_path / "p"), tokenizer_path, append_eod=False)
    assert open_token_file(tmp_path / "p").document(0).tolist() == load_tokenizer(tokenizer_path).encode(TEXTS[0])


@pytest.mark.system
def test_bad_input_midway_leaves_nothing(tmp_path, corpus, tokenizer_path):
    (tmp_path / "z.jsonl").write_text('{"text": "fine"}\n{"text": 3\n')
    with pytest.raises(InputError, match=r"z\.jsonl:2: invalid JSON"):
        preprocess(corpus + [str(tmp_path / "z.jsonl")], str(tmp_path / "out" / "p"), tokenizer_path)
    assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.system
def test_make_source_reads_the_preprocessed_file_with_its_tokenizer(tmp_path, corpus, tokenizer_path):
    preprocess(corpus, str(tmp_path / "p"), tokenizer_path)
    src = make_source("train", SourceSettings(data_path=str(tmp_path / "p")), batch_size=2,
                      feature_lengths={"targets": 8}, seed=0, shard_index=0, shard_count=1)
    assert (src.vocab_size, src.eod_id, load_tokenizer(src.tokenizer_path).sha256) == (
        400, 0, load_tokenizer(tokenizer_path).sha256)
    assert next(src)[DECODER_INPUT_TOKENS].max() < 400


def run_cli(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.system
def test_command_lines_train_a_tokenizer_then_preprocess(tmp_path, corpus):
    trained = run_cli("t5x_like.data.train_tokenizer", f"--input={','.join(corpus)}",
                      f"--output={tmp_path}/tok/tokenizer.json", "--vocab_size=300")
    assert trained.returncode == 0, trained.stderr
    assert load_tokenizer(tmp_path / "tok" / "tokenizer.json").vocab_size == 300
    done = run_cli("t5x_like.data.preprocess", f"--input={','.join(corpus)}", f"--output_prefix={tmp_path}/p",
                   f"--tokenizer={tmp_path}/tok/tokenizer.json", "--workers=1")
    assert done.returncode == 0, done.stderr
    assert "300 documents" in done.stdout and "tokens/s" in done.stdout
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    failed = run_cli("t5x_like.data.preprocess", f"--input={tmp_path}/bad.jsonl", f"--output_prefix={tmp_path}/q",
                     f"--tokenizer={tmp_path}/tok/tokenizer.json")
    assert failed.returncode == 1
    assert "bad.jsonl:1: no key 'text' (keys: body); pass --json_keys=" in failed.stderr
    assert not list(tmp_path.glob("q*"))


def test_sentencepiece_training(tmp_path):
    output = str(tmp_path / "spiece.model")
    train_sentencepiece(TEXTS, 320, output)
    tokenizer = load_tokenizer(output)
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (320, 1)
    assert tokenizer.decode(tokenizer.encode(TEXTS[3])) == TEXTS[3].strip()
