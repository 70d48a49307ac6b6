import json
import struct

import numpy as np
import pytest

from t5x_like.data import open_token_file
from t5x_like.data.token_file import TokenFileError, TokenFileWriter


def test_round_trip_small_vocabulary_is_uint16(tmp_path, write_token_file):
    documents = [[1, 2, 3], [4], [65535, 0, 7, 9]]
    tokens = open_token_file(write_token_file(tmp_path / "p", documents, vocab_size=65536))
    assert (tokens.num_documents, tokens.num_tokens, tokens.tokens.dtype) == (3, 8, np.uint16)
    assert [tokens.document(i).tolist() for i in range(3)] == documents
    assert tokens.metadata["tokenizer"]["vocab_size"] == 65536


def test_large_vocabulary_is_int32(tmp_path, write_token_file):
    tokens = open_token_file(write_token_file(tmp_path / "p", [[70000, 1], [2]], vocab_size=70001))
    assert tokens.tokens.dtype == np.int32 and tokens.document(0).tolist() == [70000, 1]


def test_index_is_megatron_mmidx(tmp_path, write_token_file):
    write_token_file(tmp_path / "p", [[1, 2, 3], [4, 5]], vocab_size=100)
    data = (tmp_path / "p.idx").read_bytes()
    magic, version, code, n, n_docs = struct.unpack("<9sQBQQ", data[:34])
    assert (magic, version, code, n, n_docs) == (b"MMIDIDX\x00\x00", 1, 8, 2, 3)
    assert np.frombuffer(data[34:42], np.int32).tolist() == [3, 2]           # sizes
    assert np.frombuffer(data[42:58], np.int64).tolist() == [0, 6]           # byte pointers
    assert np.frombuffer(data[58:], np.int64).tolist() == [0, 1, 2]          # document index


def write_megatron(prefix, documents, dtype=np.int32, code=4, magic=b"MMIDIDX\x00\x00"):
    """An indexed dataset as Megatron-LM's preprocess_data.py writes it (no .json)."""
    sizes = np.array([len(d) for d in documents], np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64) * np.dtype(dtype).itemsize
    with open(f"{prefix}.idx", "wb") as f:
        f.write(struct.pack("<9sQBQQ", magic, 1, code, len(sizes), len(sizes) + 1))
        f.write(sizes.tobytes() + pointers.tobytes() + np.arange(len(sizes) + 1, dtype=np.int64).tobytes())
    np.concatenate([np.asarray(d, dtype) for d in documents]).tofile(f"{prefix}.bin")
    return str(prefix)


def test_opens_megatron_files_without_metadata(tmp_path):
    tokens = open_token_file(write_megatron(tmp_path / "m", [[10, 11], [12, 13, 14], [50000]]))
    assert tokens.metadata is None and tokens.num_documents == 3
    assert tokens.document(1).tolist() == [12, 13, 14] and tokens.document(2).tolist() == [50000]


def test_bad_magic_names_the_file(tmp_path):
    write_megatron(tmp_path / "m", [[1, 2]], magic=b"TNTIDX\x00\x00\x00")
    with pytest.raises(TokenFileError, match=r"m\.idx: not an MMIDIDX index"):
        open_token_file(tmp_path / "m")


def test_float_dtype_code_is_rejected(tmp_path):
    write_megatron(tmp_path / "m", [[1, 2]], dtype=np.float32, code=7)
    with pytest.raises(TokenFileError, match=r"m\.idx: token dtype code 7 is not an integer type"):
        open_token_file(tmp_path / "m")


def test_truncated_bin_is_an_error(tmp_path, write_token_file):
    prefix = write_token_file(tmp_path / "p", [[1, 2, 3], [4, 5]])
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(6)
    with pytest.raises(TokenFileError, match=r"p\.bin: 6 bytes but .*p\.idx describes 10.*truncated"):
        open_token_file(prefix)


def test_truncated_idx_is_an_error(tmp_path, write_token_file):
    prefix = write_token_file(tmp_path / "p", [[1, 2, 3], [4, 5]])
    with open(prefix + ".idx", "r+b") as f:
        f.truncate(50)
    with pytest.raises(TokenFileError, match=r"p\.idx: 50 bytes but its header describes 82"):
        open_token_file(prefix)


def test_metadata_from_another_run_is_an_error(tmp_path, write_token_file):
    prefix = write_token_file(tmp_path / "p", [[1, 2, 3], [4, 5]])
    metadata = json.loads(open(prefix + ".json").read())
    (tmp_path / "p.json").write_text(json.dumps({**metadata, "num_tokens": 99}))
    with pytest.raises(TokenFileError, match=r"p\.json: says .* 99\).*different runs"):
        open_token_file(prefix)


def test_missing_file_names_the_fix(tmp_path):
    with pytest.raises(TokenFileError, match=r"nothing\.idx: missing.*t5x_like\.data\.preprocess"):
        open_token_file(tmp_path / "nothing")


def test_interrupted_write_leaves_the_previous_file_and_no_temporaries(tmp_path, write_token_file):
    prefix = write_token_file(tmp_path / "p", [[1, 2, 3]])
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(KeyboardInterrupt):
        with TokenFileWriter(prefix, np.uint16, {"tokenizer": {}}) as writer:
            writer.write(np.array([7, 8, 9, 10]), np.array([4]))
            raise KeyboardInterrupt
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert open_token_file(prefix).document(0).tolist() == [1, 2, 3]


def test_writing_nothing_is_an_error_and_writes_nothing(tmp_path):
    with pytest.raises(TokenFileError, match="no documents to write"):
        with TokenFileWriter(tmp_path / "p", np.uint16, {"tokenizer": {}}):
            pass
    assert list(tmp_path.iterdir()) == []



LATE_TRUNCATION = """
import os, sys
from t5x_like.data import open_token_file
from t5x_like.data.token_file import MappedTokens, TokenFileError
tokens = open_token_file(sys.argv[1]).tokens
os.truncate(sys.argv[1] + ".bin", 4096)
MappedTokens.check = lambda self: None  # the size check ran just before the truncation and passed
try:
    tokens[100_000:200_000]
except TokenFileError as e:
    print(e)
"""


@pytest.mark.system
def test_a_truncation_between_the_size_check_and_the_read_is_named_not_sigbus(tmp_path, write_token_file):
    """grain's prefetch threads read while the main thread runs: a file cut short after a reader checked its size
    and before it read must still be an error naming the file. A memory map read there is SIGBUS (exit -7), which
    took down a pytest worker in CI; ranges are read with pread, where it is a short read."""
    import subprocess
    import sys
    prefix = write_token_file(tmp_path / "p", [list(range(1000)) * 100] * 20, vocab_size=1000)
    done = subprocess.run([sys.executable, "-c", LATE_TRUNCATION, str(prefix)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.startswith(f"{prefix}.bin: a short read at id 100000: the file was cut short"), done.stdout
