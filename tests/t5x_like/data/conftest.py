"""Fixtures for the data tests: the real tokenizer files in ../shared/data, small token files."""
from pathlib import Path

import numpy as np
import pytest

from t5x_like.data.token_file import TokenFileWriter, token_dtype

from tests.support.shared_data import shared_file


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """<repo>/../shared/data (real GPT-2 / NeoX / T5 tokenizers and WikiText); skips when absent."""
    return shared_file()


def _write_token_file(prefix, documents, vocab_size=1000, tokenizer=None):
    """A token file holding `documents` (lists of ids) with metadata for a fake or given tokenizer."""
    made_with = tokenizer or {"path": "fake", "sha256": "0" * 64, "vocab_size": vocab_size, "eod_id": 0}
    lengths = np.array([len(d) for d in documents])
    ids = np.concatenate([np.asarray(d, np.int64) for d in documents])
    with TokenFileWriter(prefix, token_dtype(made_with["vocab_size"]), {"tokenizer": made_with}) as writer:
        writer.write(ids, lengths)
    return str(prefix)


@pytest.fixture(scope="session")
def write_token_file():
    """write_token_file(prefix, documents, vocab_size=1000, tokenizer=None) -> prefix."""
    return _write_token_file


@pytest.fixture
def numbered_documents():
    """200 documents of 5..60 tokens; document d holds ids 1000*d+1, 1000*d+2, ... (so ids name it)."""
    rng = np.random.default_rng(0)
    return [[1000 * d + 1 + t for t in range(int(n))] for d, n in enumerate(rng.integers(5, 61, 200))]


@pytest.fixture
def numbered_file(tmp_path, numbered_documents):
    return _write_token_file(tmp_path / "numbered", numbered_documents, vocab_size=1 << 20)
