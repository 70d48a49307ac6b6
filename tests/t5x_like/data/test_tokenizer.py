"""Encodings equal the reference libraries' on real text (the real tokenizer files in ../shared/data)."""
import shutil

import pytest
import sentencepiece
import tiktoken
import transformers
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from t5x_like.data import formats, load_tokenizer

EDGE_CASES = ["Hello world", "  leading and   inner  spaces\n\n\ttabs\r\n", "it's we've they'll I'd",
              "naïve café — 東京 🙂 \u200b", "<|endoftext|> is plain text here", "1234567 3.14159 x**2"]


@pytest.fixture(scope="module")
def wikitext_documents(shared_data):
    path = str(shared_data / "wikitext" / "wt-raw" / "wiki.test.raw")
    return list(formats.read_documents([path], "wikitext"))


def test_wikitext_raw_has_its_articles(wikitext_documents):
    assert len(wikitext_documents) == 62
    assert wikitext_documents[0].startswith(" = Robert Boulter = \n")


@pytest.fixture(scope="module")
def tiktoken_gpt2(shared_data):
    ranks = data_gym_to_mergeable_bpe_ranks(str(shared_data / "gpt2-bpe" / "vocab.bpe"),
                                            str(shared_data / "gpt2-bpe" / "encoder.json"))
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


@pytest.mark.parametrize("file_names", [("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")])
def test_gpt2_bpe_matches_tiktoken(shared_data, tmp_path, tiktoken_gpt2, wikitext_documents, file_names):
    for source, name in zip(("encoder.json", "vocab.bpe"), file_names):
        shutil.copy(shared_data / "gpt2-bpe" / source, tmp_path / name)
    tokenizer = load_tokenizer(tmp_path)
    assert (tokenizer.vocab_size, tokenizer.eod_id, tokenizer.path) == (50257, 50256, str(tmp_path))
    documents = wikitext_documents + EDGE_CASES
    ids, lengths = tokenizer.encode_documents(documents, append_eod=True)
    # A literal "<|endoftext|>" in text is the special token, as in transformers' GPT-2 tokenizer.
    expected = [tiktoken_gpt2.encode(d, allowed_special="all") + [50256] for d in documents]
    assert _split(ids, lengths) == expected
    assert tokenizer.decode(tokenizer.encode(EDGE_CASES[3])) == EDGE_CASES[3]


def test_neox_tokenizer_json_matches_transformers(shared_data, wikitext_documents):
    path = shared_data / "gpt-neox-20b-tokenizer" / "20B_tokenizer.json"
    tokenizer = load_tokenizer(path)
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (50277, 0)
    reference = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path))
    documents = wikitext_documents + EDGE_CASES
    ids, lengths = tokenizer.encode_documents(documents, append_eod=True)
    assert _split(ids, lengths) == [reference.encode(d) + [0] for d in documents]


def test_t5_sentencepiece_matches_sentencepiece(shared_data, wikitext_documents):
    tokenizer = load_tokenizer(shared_data / "t5-spiece")  # a directory with one .model
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (32000, 1)
    reference = sentencepiece.SentencePieceProcessor(model_file=str(shared_data / "t5-spiece" / "spiece.model"))
    documents = wikitext_documents + EDGE_CASES
    ids, lengths = tokenizer.encode_documents(documents, append_eod=True)
    assert _split(ids, lengths) == [reference.encode(d) + [1] for d in documents]


def test_token_to_id_finds_pieces_and_only_pieces(shared_data):
    spiece = load_tokenizer(shared_data / "t5-spiece")
    reference = sentencepiece.SentencePieceProcessor(model_file=str(shared_data / "t5-spiece" / "spiece.model"))
    assert [spiece.token_to_id(p) for p in ("</s>", "<unk>", "▁the")] == [1, 2, reference.piece_to_id("▁the")]
    assert spiece.token_to_id("<extra_id_0>") is None  # sentencepiece answers the <unk> id; that is no piece
    gpt2 = load_tokenizer(shared_data / "gpt2-bpe")
    assert (gpt2.token_to_id("<|endoftext|>"), gpt2.token_to_id("<extra_id_0>")) == (50256, None)


def test_the_same_vocabulary_has_the_same_identity_whatever_the_path(shared_data, tmp_path):
    shutil.copytree(shared_data / "gpt2-bpe", tmp_path / "copy")
    assert load_tokenizer(tmp_path / "copy").sha256 == load_tokenizer(shared_data / "gpt2-bpe").sha256
    assert load_tokenizer(shared_data / "t5-spiece").sha256 != load_tokenizer(shared_data / "gpt2-bpe").sha256


def test_a_directory_with_tokenizer_json_uses_it_over_bpe_files(shared_data, tmp_path):
    shutil.copytree(shared_data / "gpt2-bpe", tmp_path / "model")
    shutil.copy(shared_data / "gpt-neox-20b-tokenizer" / "20B_tokenizer.json", tmp_path / "model" / "tokenizer.json")
    tokenizer = load_tokenizer(tmp_path / "model")
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (50277, 0)


def test_a_path_that_is_no_tokenizer_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    expected = rf"--tokenizer={tmp_path}: not a tokenizer.*tokenizer.json.*vocab.json\+merges.txt"
    with pytest.raises(ValueError, match=expected):
        load_tokenizer(tmp_path)


def _split(ids, lengths):
    out, start = [], 0
    for n in lengths:
        out.append(ids[start:start + n].tolist())
        start += n
    return out
