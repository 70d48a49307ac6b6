"""A resume refuses data whose content changed anywhere, at the same size too (a token file edited in its middle,
a Megatron file without P.json, JSONL pairs), and reads no file in full to know that an untouched one is the same:
preprocess records the sha256 in P.json, checkpoints record it with the files' modification times."""
import json
import os
import shutil

import numpy as np
import pytest
import tokenizers
from tokenizers import models, pre_tokenizers

from t5x_like.data import SourceSettings, fingerprint, make_source
from t5x_like.data.loader import DataChangedError


def source(path, **settings):
    return make_source("train", SourceSettings(data_path=path, data_split="1,0,0", **settings), batch_size=2,
                       feature_lengths={"targets": 8}, seed=0, shard_index=0, shard_count=1)


def saved_state(path, **settings) -> dict:
    """The data position a checkpoint of a run on `path` records, two batches in."""
    src = source(path, **settings)
    next(src), next(src)
    state = json.loads(json.dumps(src.get_state()))  # as the checkpoint's JSON holds it
    src.close()
    return state


@pytest.fixture
def reads(monkeypatch):
    """The files fingerprint.py reads in full."""
    read = []
    whole = fingerprint.sha256_of
    monkeypatch.setattr(fingerprint, "sha256_of", lambda path: read.append(os.path.basename(path)) or whole(path))
    return read


@pytest.fixture
def corpus(tmp_path, write_token_file):
    return write_token_file(tmp_path / "corpus", [list(range(1, 400)), list(range(5, 300))], vocab_size=512)


def edit_middle(path: str) -> None:
    """One id in the middle of the file replaced by another: the same size, other bytes."""
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))


def test_a_token_file_edited_in_its_middle_at_the_same_size_is_refused(corpus, reads):
    state = saved_state(corpus)
    assert reads == []  # preprocess recorded the sha256 in corpus.json
    source(corpus).set_state(state)  # untouched: resumes, nothing read
    assert reads == []
    edit_middle(corpus + ".bin")
    with pytest.raises(DataChangedError, match=r"data file 1 \(.*corpus\): its contents \(same size, other bytes\)\. "
                                               r"Resuming would continue at row 4 of other data"):
        source(corpus).set_state(state)
    assert reads == ["corpus.bin"]  # the edited file alone, once


def test_a_copied_corpus_resumes_after_one_read_and_a_moved_one_without(corpus, tmp_path, reads):
    state = saved_state(corpus)
    moved = tmp_path / "moved"
    moved.mkdir()
    for suffix in (".json", ".bin", ".idx"):  # P.json copied first: it no longer vouches for the newer .bin
        shutil.copyfile(corpus + suffix, str(moved / "corpus") + suffix)
    copy = source(str(moved / "corpus"))
    copy.set_state(state)
    assert sorted(reads) == ["corpus.bin", "corpus.idx"]
    assert copy.get_state()["fingerprint"]["files"][0]["sha256"] == state["fingerprint"]["files"][0]["sha256"]
    os.rename(moved / "corpus.bin", tmp_path / "corpus.bin.moved")  # a move keeps the modification time
    os.rename(tmp_path / "corpus.bin.moved", moved / "corpus.bin")
    reads.clear()
    source(str(moved / "corpus")).set_state(copy.get_state())
    assert reads == []


def test_a_file_without_recorded_sha256_is_read_once_for_the_checkpoint(corpus, reads):
    """A Megatron token file (no P.json: TOKENIZER names its tokenizer) is read in full when the first checkpoint
    records it, then compared by modification time, and read again only once touched."""
    os.remove(corpus + ".json")
    tokenizer = word_tokenizer(os.path.dirname(corpus))
    state = saved_state(corpus, tokenizer=tokenizer)
    assert sorted(reads) == ["corpus.bin", "corpus.idx"]
    reads.clear()
    source(corpus, tokenizer=tokenizer).set_state(state)
    assert reads == []
    edit_middle(corpus + ".bin")
    with pytest.raises(DataChangedError, match="its contents"):
        source(corpus, tokenizer=tokenizer).set_state(state)


def word_tokenizer(folder) -> str:
    """A tokenizer.json of 512 ids in `folder` (every id of the corpus is one of them)."""
    path = os.path.join(folder, "tokenizer.json")
    vocab = {f"t{i}": i for i in range(511)} | {"<|endoftext|>": 511}
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    tokenizer.save(path)
    return path


def test_jsonl_pairs_edited_at_the_same_size_are_refused(tmp_path, reads):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"inputs": f"input {i}", "targets": f"target {i}"}) + "\n"
                             for i in range(8)))
    settings = dict(objective="seq2seq", tokenizer=word_tokenizer(tmp_path))
    src = make_source("train", SourceSettings(data_path={"train": str(pairs)}, **settings), batch_size=2,
                      feature_lengths={"inputs": 8, "targets": 8}, seed=0, shard_index=0, shard_count=1)
    next(src)
    state = json.loads(json.dumps(src.get_state()))
    pairs.write_text(pairs.read_text().replace("input 3", "input 4"))
    again = make_source("train", SourceSettings(data_path={"train": str(pairs)}, **settings), batch_size=2,
                        feature_lengths={"inputs": 8, "targets": 8}, seed=0, shard_index=0, shard_count=1)
    with pytest.raises(DataChangedError, match=r"data file 1 \(.*pairs\.jsonl\): its contents"):
        again.set_state(state)


def test_a_checkpoint_of_an_older_version_is_compared_by_size(corpus):
    state = saved_state(corpus)
    for file in state["fingerprint"]["files"]:  # what checkpoints recorded before the sha256
        file.pop("sha256"), file.pop("mtime_ns")
        file["crc32"] = [0, 0]
    source(corpus).set_state(state)
    assert np.all([f["sha256"] for f in source(corpus).get_state()["fingerprint"]["files"]])
