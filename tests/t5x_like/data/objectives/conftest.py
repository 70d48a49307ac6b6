"""Fixtures of the objectives' tests: the word-level tokenizer and a token file of random word ids."""
import numpy as np
import pytest

from t5x_like.data.token_file import TokenFileWriter
from tests.t5x_like.data.objectives.helpers import VOCAB, made_with, word_tokenizer


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    return word_tokenizer(tmp_path_factory.mktemp("tokenizer") / "words.json")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tokenizer_path):
    """300 documents of 1..400 random word ids (never 0-2 nor a sentinel), as a token file; (prefix, documents)."""
    rng = np.random.default_rng(0)
    documents = [rng.integers(3, VOCAB, n).tolist() for n in rng.integers(1, 400, 300)]
    prefix = tmp_path_factory.mktemp("corpus") / "docs"
    lengths = np.array([len(d) for d in documents])
    with TokenFileWriter(prefix, np.uint16, {"tokenizer": made_with(tokenizer_path)}) as writer:
        writer.write(np.concatenate(documents), lengths)
    return str(prefix), documents
