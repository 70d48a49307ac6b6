"""GPT2-Chinese's document layout against GPT2-Chinese's own code, written out below as its train.py and
generate.py have it (github.com/Morizeyao/GPT2-Chinese @ bbb4465): its tokenizer is transformers' BertTokenizer
over the same vocab.txt (tokenizations/tokenization_bert.py is a copy of it)."""
from pathlib import Path

import pytest

from t5x_like.data import layouts
from t5x_like.data.tokenizer import load_tokenizer
from t5x_like.data.train_tokenizer import character_vocabulary, write_vocab_txt

transformers = pytest.importorskip("transformers", reason="needs the torch extra (transformers)")

ARTICLES = ["今天天气很好，我们去公园散步。\n北京是中国的首都，有很多名胜古迹。",
            "春眠不觉晓，处处闻啼鸟。\n\n夜来风雨声，花落知多少。\n",
            "\n清华大学位于北京市海淀区，成立于1911年。它的英文名是 Tsinghua University。"]


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("char") / "vocab.txt"
    write_vocab_txt(character_vocabulary(ARTICLES, 2000, 1, True), str(path), True)
    return path


def build_files(tokenizer, lines: list[str]) -> list[int]:
    """GPT2-Chinese's train.py build_files, for one piece, without its min_length filter."""
    lines = [line.replace("\n", " [SEP] ") for line in lines]  # 用[SEP]表示换行, 段落之间使用SEP表示段落结束
    sublines = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(line)) for line in lines]
    full_line = []
    for subline in sublines:
        full_line.append(tokenizer.convert_tokens_to_ids("[MASK]"))  # 文章开头添加MASK表示文章开始
        full_line.extend(subline)
        full_line.append(tokenizer.convert_tokens_to_ids("[CLS]"))  # 文章之间添加CLS表示文章结束
    return full_line


def printed(tokenizer, ids: list[int]) -> str:
    """GPT2-Chinese's generate.py, turning ids into the text it prints (but for its final strip())."""
    text = tokenizer.convert_ids_to_tokens(ids)
    for i, item in enumerate(text[:-1]):  # 确保英文前后有空格
        if is_word(item) and is_word(text[i + 1]):
            text[i] = item + " "
    for i, item in enumerate(text):
        if item == "[MASK]":
            text[i] = ""
        elif item == "[CLS]":
            text[i] = "\n\n"
        elif item == "[SEP]":
            text[i] = "\n"
    return "".join(text).replace("##", "")


def is_word(word):
    for item in list(word):
        if item not in "qwertyuiopasdfghjklzxcvbnm":
            return False
    return True


def test_token_files_hold_the_ids_gpt2_chinese_trains_on(vocab):
    ours = layouts.with_layout(load_tokenizer(vocab), layouts.GPT2_CHINESE, str(vocab))
    ids, lengths = ours.encode_documents(ARTICLES, append_eod=True)
    assert ids.tolist() == build_files(transformers.BertTokenizer(str(vocab)), ARTICLES)
    assert lengths.tolist() == [len(build_files(transformers.BertTokenizer(str(vocab)), [a])) for a in ARTICLES]
    assert ours.eod_id == ours.token_to_id("[CLS]") and ours.document_start_id == ours.token_to_id("[MASK]")


def test_generated_ids_read_as_gpt2_chinese_prints_them(vocab):
    ours = layouts.with_layout(load_tokenizer(vocab), layouts.GPT2_CHINESE, str(vocab))
    upstream = transformers.BertTokenizer(str(vocab))
    ids, _ = ours.encode_documents(ARTICLES, append_eod=True)
    assert ours.decode(ids.tolist()) == printed(upstream, ids.tolist())
    assert ours.decode(ours.encode(ARTICLES[1])) == ARTICLES[1]  # Chinese text and its newlines come back whole
    assert ours.decode([ours.document_start_id, *ours.encode("春眠"), ours.eod_id]) == "春眠\n\n"


def test_the_layout_is_recorded_with_the_tokenizer_and_changes_its_identity(vocab):
    plain = load_tokenizer(vocab)
    ours = layouts.with_layout(plain, layouts.GPT2_CHINESE, str(vocab))
    assert ours.hf_tokenizer_config()["document_layout"] == "gpt2_chinese"
    assert ours.hf_files() == plain.hf_files() and ours.vocab_size == plain.vocab_size
    assert ours.sha256 != plain.sha256  # token files of the two layouts are never mixed
    assert layouts.split_prefix(f"gpt2_chinese:{vocab}") == ("gpt2_chinese", str(vocab))
    assert layouts.split_prefix(str(vocab)) == (None, str(vocab))


def test_only_a_wordpiece_vocabulary_takes_the_layout(vocab, tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"[UNK]": 0, "</s>": 1, "今": 2}, unk_token="[UNK]")).save(str(tmp_path / "words.json"))
    with pytest.raises(ValueError, match=r"words.json: GPT2-Chinese's layout is for a character / WordPiece "
                                         r"vocab.txt, not this HuggingFaceTokenizer."):
        layouts.with_layout(load_tokenizer(tmp_path / "words.json"), layouts.GPT2_CHINESE, str(tmp_path / "words.json"))
    with pytest.raises(ValueError, match="document_layout 'gpt3' is unknown"):
        layouts.with_layout(load_tokenizer(vocab), "gpt3", "vocab.txt")


@pytest.mark.system
def test_a_token_file_made_with_the_prefix_keeps_the_layout(vocab, tmp_path):
    """`preprocess --tokenizer=gpt2_chinese:vocab.txt` writes GPT2-Chinese's ids, and the tokenizer the token
    file records (unpacked wherever it is read) is again that layout."""
    import json
    import subprocess
    import sys

    from t5x_like.data import open_token_file
    from t5x_like.data.tokenizer_files import recorded_tokenizer_path

    (tmp_path / "train.json").write_text(json.dumps(ARTICLES, ensure_ascii=False), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "t5x_like.data.preprocess", "--input=train.json",
                           "--output_prefix=data/chinese", f"--tokenizer=gpt2_chinese:{vocab}"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    tokens = open_token_file(str(tmp_path / "data" / "chinese"))
    assert tokens.tokens[:].tolist() == build_files(transformers.BertTokenizer(str(vocab)), ARTICLES)
    recorded = load_tokenizer(recorded_tokenizer_path(tokens.metadata["tokenizer"]))
    assert isinstance(recorded, layouts.GPT2ChineseLayout) and recorded.eod_id == recorded.token_to_id("[CLS]")
