"""Encodings equal the reference libraries' on real text (the real tokenizer files in ../shared/data)."""
import shutil

import numpy as np
import pytest
import sentencepiece
import tiktoken
import transformers
from tiktoken.load import data_gym_to_mergeable_bpe_ranks
from tiktoken_ext.openai_public import r50k_pat_str

from t5x_like.data import formats, load_tokenizer
from t5x_like.errors import UserError

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


def _spiece_charsmap(model_file):
    """The normalizer's precompiled_charsmap of a sentencepiece model (field 2 of field 3 of the ModelProto),
    read from the protobuf wire format: transformers' own reader needs a protobuf runtime the test extra's
    pin (<7, for tensorflow-datasets) is older than."""
    def fields(buffer):
        i = 0
        while i < len(buffer):
            key, i = _varint(buffer, i)
            wire = key & 7
            if wire == 0:
                value, i = _varint(buffer, i)
            elif wire == 2:
                size, i = _varint(buffer, i)
                value, i = buffer[i:i + size], i + size
            else:
                value, i = None, i + {1: 8, 5: 4}[wire]
            yield key >> 3, value

    normalizer = next(value for number, value in fields(model_file.read_bytes()) if number == 3)
    return next(value for number, value in fields(normalizer) if number == 2)


def _varint(buffer, i):
    value = shift = 0
    while True:
        byte = buffer[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


@pytest.fixture(scope="module")
def transformers_t5(shared_data):
    """transformers' T5 tokenizer for T5's spiece.model, built as its from_pretrained builds it (T5Converter's
    vocabulary: the pieces, then <extra_id_99> .. <extra_id_0>; the model's normalizer)."""
    from transformers.convert_slow_tokenizer import T5Converter

    model_file = shared_data / "t5-spiece" / "spiece.model"
    processor = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    pieces = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    kwargs = T5Converter.convert_from_spm(vocab=pieces, extra_ids=100)
    return transformers.T5Tokenizer(**kwargs, _spm_precompiled_charsmap=_spiece_charsmap(model_file))


SENTINEL_TEXTS = ["The <extra_id_0> walks in <extra_id_1> park", "a<extra_id_0>b", "<extra_id_0> x <extra_id_99>",
                  "  <extra_id_5>  hi  ", "x <extra_id_100> y", "a\n<extra_id_3>\nb", "end.<extra_id_0>",
                  "<extra_id_7><extra_id_8>", "Hello world"]


def test_t5_sentinels_encode_and_decode_as_transformers_t5_tokenizer(shared_data, transformers_t5):
    tokenizer = load_tokenizer(shared_data / "t5-spiece" / "spiece.model")
    assert transformers_t5.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>"]) == [32099, 32000]
    expected = [transformers_t5.encode(text, add_special_tokens=False) for text in SENTINEL_TEXTS]
    assert tokenizer.encode_batch(SENTINEL_TEXTS) == expected
    assert 32099 in expected[0] and 32098 in expected[0]
    assert tokenizer.vocab_size == 32000 and tokenizer.token_to_id("<extra_id_0>") is None  # objectives add them
    rng = np.random.default_rng(0)
    for ids in expected + [rng.integers(3, 32100, 40).tolist() for _ in range(20)]:
        if 2 in ids:  # <unk>: sentencepiece writes " ⁇ ", transformers "<unk>"
            continue
        assert tokenizer.decode(ids) == transformers_t5.decode(ids, skip_special_tokens=False), ids


@pytest.mark.parametrize("name", ["t5-spiece", "gpt2-bpe", "gpt-neox-20b-tokenizer/20B_tokenizer.json"])
def test_decoding_never_raises_for_an_id_a_model_can_produce(shared_data, name):
    tokenizer = load_tokenizer(shared_data / name)
    ids = list(range(0, tokenizer.vocab_size + 100 + 28))  # a model's vocabulary: sentinels, padding rows
    assert isinstance(tokenizer.decode(ids), str)
    assert all(isinstance(tokenizer.decode([i]), str) for i in range(tokenizer.vocab_size - 5, len(ids)))


@pytest.mark.parametrize("given", ["folder", "gpt2-vocab.json", "gpt2-merges.txt"])
def test_megatron_gpt2_file_names_are_a_gpt2_bpe(shared_data, tmp_path, tiktoken_gpt2, given):
    shutil.copy(shared_data / "gpt2-bpe" / "encoder.json", tmp_path / "gpt2-vocab.json")
    shutil.copy(shared_data / "gpt2-bpe" / "vocab.bpe", tmp_path / "gpt2-merges.txt")
    tokenizer = load_tokenizer(tmp_path if given == "folder" else tmp_path / given)
    assert (tokenizer.vocab_size, tokenizer.eod_id) == (50257, 50256)
    assert tokenizer.encode_batch(EDGE_CASES) == [tiktoken_gpt2.encode(d, allowed_special="all") for d in EDGE_CASES]


def test_a_json_file_that_is_no_tokenizer_is_one_line(shared_data, tmp_path):
    shutil.copy(shared_data / "gpt2-bpe" / "encoder.json", tmp_path / "gpt2-vocab.json")  # no merges beside it
    with pytest.raises(UserError) as error:
        load_tokenizer(tmp_path / "gpt2-vocab.json")
    assert "\n" not in str(error.value) and "is not a Hugging Face tokenizer.json" in str(error.value)


def llama3_like_folder(folder, *, eos_token=None, ordinary=("</s>",)):
    """A tokenizer.json with Llama 3's special tokens (<|begin_of_text|> first through its post-processor,
    <|end_of_text|>, <|eot_id|>), `ordinary` tokens in its plain vocabulary, and optionally a tokenizer_config.json."""
    import json

    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {token: i for i, token in enumerate(["a", "b", "c", " ", *ordinary])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])
    bos = tokenizer.token_to_id("<|begin_of_text|>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                             special_tokens=[("<|begin_of_text|>", bos)])
    folder.mkdir()
    tokenizer.save(str(folder / "tokenizer.json"))
    if eos_token:
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": eos_token}))
    return tokenizer


def test_a_llama3_tokenizer_ends_documents_with_its_end_of_text_token(tmp_path):
    """Llama 3 names its end token <|end_of_text|>; a "</s>" in its plain vocabulary is not taken for it."""
    reference = llama3_like_folder(tmp_path / "llama3")
    tokenizer = load_tokenizer(str(tmp_path / "llama3"))
    assert tokenizer.eod_id == reference.token_to_id("<|end_of_text|>")
    assert tokenizer.bos_id == reference.token_to_id("<|begin_of_text|>")


def test_the_folders_eos_token_names_the_end_of_document(tmp_path):
    """As transformers and Megatron's HuggingFaceTokenizer do: tokenizer_config.json's eos_token (a string, or
    the {"content": ...} of older files) wins over the usual names."""
    reference = llama3_like_folder(tmp_path / "instruct", eos_token="<|eot_id|>")
    assert load_tokenizer(str(tmp_path / "instruct")).eod_id == reference.token_to_id("<|eot_id|>")
    llama3_like_folder(tmp_path / "old", eos_token={"content": "<|eot_id|>", "special": True})
    assert load_tokenizer(str(tmp_path / "old")).eod_id == reference.token_to_id("<|eot_id|>")


def test_a_special_end_token_wins_over_a_plain_vocabulary_entry(tmp_path):
    """<|endoftext|> as an ordinary piece of the vocabulary loses to Llama 3's special <|end_of_text|>."""
    reference = llama3_like_folder(tmp_path / "mixed", ordinary=("<|endoftext|>",))
    assert load_tokenizer(str(tmp_path / "mixed")).eod_id == reference.token_to_id("<|end_of_text|>")
