import os
from pathlib import Path

import numpy as np
import pytest

from t5x_like.data import BUILTIN_VOCAB_SIZE, load_tokenizer, make_source, open_token_file
from t5x_like.data import builtin
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS


@pytest.fixture(scope="module")
def builtin_cache(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("T5X_LIKE_CACHE", str(cache))
        builtin.builtin_corpus()
        yield cache


def test_documents_are_deterministic_and_a_few_megabytes():
    first, second = builtin.builtin_documents(), builtin.builtin_documents()
    assert first == second
    assert 1_000_000 < sum(map(len, first)) < 10_000_000
    assert any("asyncio.base_events" in d for d in first)


def test_tokenizer_has_the_fixed_vocabulary_and_eod(builtin_cache, monkeypatch):
    monkeypatch.setenv("T5X_LIKE_CACHE", str(builtin_cache))
    prefix, tokenizer_path = builtin.builtin_corpus()
    tokenizer = load_tokenizer(tokenizer_path)
    assert tokenizer.vocab_size == BUILTIN_VOCAB_SIZE == 8192
    assert tokenizer.eod_id == 0
    tokens = open_token_file(prefix)
    assert tokens.metadata["tokenizer"]["sha256"] == tokenizer.sha256
    assert tokens.num_documents > 500 and tokens.num_tokens > 300_000
    assert int(tokens.tokens.max()) < BUILTIN_VOCAB_SIZE
    assert all(tokens.document(i)[-1] == tokenizer.eod_id for i in range(0, tokens.num_documents, 97))
    text = "Return the value of the named attribute of object."
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_second_use_loads_from_cache(builtin_cache, monkeypatch):
    monkeypatch.setenv("T5X_LIKE_CACHE", str(builtin_cache))
    before = os.stat(builtin.cache_dir() / "corpus.bin").st_mtime_ns
    monkeypatch.setattr(builtin, "builtin_documents", lambda: pytest.fail("rebuilt a cached corpus"))
    builtin.builtin_corpus()
    assert os.stat(builtin.cache_dir() / "corpus.bin").st_mtime_ns == before


def test_concurrent_builders_agree_and_leave_no_temporaries(tmp_path, monkeypatch):
    monkeypatch.setenv("T5X_LIKE_CACHE", str(tmp_path))
    monkeypatch.setattr(builtin, "BUILTIN_VOCAB_SIZE", 300)
    monkeypatch.setattr(builtin, "builtin_documents", lambda: [f"document {i} about python" for i in range(50)])
    final = builtin.cache_dir()
    builtin._build(final)
    winner = (final / "corpus.bin").read_bytes()
    builtin._build(final)  # a process that lost the race: its rename fails, it keeps the winner's files
    assert (final / "corpus.bin").read_bytes() == winner
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_make_source_without_data_path_serves_the_builtin_corpus(builtin_cache, monkeypatch):
    monkeypatch.setenv("T5X_LIKE_CACHE", str(builtin_cache))
    source = make_source("train", batch_size=4, feature_lengths={"targets": 32}, seed=0, shard_index=0, shard_count=1)
    assert source.vocab_size == 8192 and source.eod_id == 0
    assert Path(source.tokenizer_path).is_file()
    batch = next(source)
    assert batch[DECODER_INPUT_TOKENS].shape == batch[DECODER_TARGET_TOKENS].shape == (4, 32)
    assert batch[DECODER_INPUT_TOKENS].dtype == np.int32 and batch[DECODER_LOSS_WEIGHTS].dtype == np.float32
    np.testing.assert_array_equal(batch[DECODER_INPUT_TOKENS][:, 1:], batch[DECODER_TARGET_TOKENS][:, :-1])


def test_builtin_validation_starts_at_the_first_held_out_document(builtin_cache, monkeypatch):
    monkeypatch.setenv("T5X_LIKE_CACHE", str(builtin_cache))
    corpus = open_token_file(builtin.builtin_corpus()[0])
    first_held_out = round(corpus.num_documents * 949 / 1000)  # DATA_SPLIT defaults to '949,50,1'
    validation = make_source("validation", batch_size=2, feature_lengths={"targets": 64}, seed=0, shard_index=0, shard_count=1)
    row = next(validation)[DECODER_INPUT_TOKENS][0]
    np.testing.assert_array_equal(row, corpus.tokens[corpus.offsets[first_held_out]:][:64])
