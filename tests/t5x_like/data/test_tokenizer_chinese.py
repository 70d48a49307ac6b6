"""BERT vocab.txt (WordPiece and GPT2-Chinese's character vocabularies) and CPM's jieba + sentencepiece tokenizer.

References: transformers' BertTokenizerFast (built from the same vocab.txt) for WordPiece, and CPM-Generate's
tokenizer (jieba + str.translate + sentencepiece, written out below as CPM-Generate has it) for CPM.
"""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sentencepiece

from t5x_like.data import formats, load_tokenizer
from t5x_like.data.tokenizer import bert_wordpiece
from t5x_like.data.train_tokenizer import character_vocabulary, train_wordpiece, write_vocab_txt
from t5x_like.errors import UserError
from t5x_like.inference import loading
from tests.support.cli import train_tokenizer

REPO = Path(__file__).resolve().parents[3]
jieba = pytest.importorskip("jieba", reason="the CPM tokenizer needs the chinese extra (pip install jieba)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (transformers)")

CHINESE = [
    "今天天气很好，我们去公园散步。北京是中国的首都，有很多名胜古迹，比如故宫和天坛。",
    "清华大学位于北京市海淀区，成立于1911年。它的英文名是 Tsinghua University，\n简称 THU。",
    "人工智能（Artificial Intelligence，AI）是计算机科学的一个分支。\n\n它企图了解智能的实质，"
    "并生产出一种新的能以人类智能相似的方式做出反应的智能机器。",
    "我爱北京天安门，天安门上太阳升。  伟大领袖毛主席，指引我们向前进！",
    "2020年11月，CPM 模型发布：26 亿参数，100GB 中文训练数据。GPT-3 有 1750 亿参数。",
    "他说：“明天下雨的话，我们就不去了。”她回答：“好的，那我们下周再去吧。”",
    "深度学习模型需要大量的数据和计算资源。训练一个大模型可能需要数千块 GPU 和数周的时间。",
    "上海是中国最大的城市之一，人口超过两千四百万。黄浦江穿城而过，外滩的夜景非常美丽。",
    "《红楼梦》是中国古典四大名著之一，作者是曹雪芹。书中描写了贾、史、王、薛四大家族的兴衰。",
    "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。\n床前明月光，疑是地上霜。举头望明月，低头思故乡。",
]
ENGLISH_EDGE_CASES = ["Hello World", "naïve café — Ünïcödé ÀÉÎ", "it's we've they'll I'd", "[SEP] and [CLS] here",
                      "  spaces\n\n\ttabs\r\n", "x" * 150, "e-mail: someone@example.com, 3.14159!",
                      "混合 mixed 文本 text，标点。"]


class CpmGenerateTokenizer:
    """CPM-Generate's tokenizer (its GPT2Tokenizer's tokenize/encode/decode over chinese_vocab.model)."""

    def __init__(self, model_file):
        self.sp = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        self.translator = str.maketrans(" \n", "\u2582\u2583")

    def encode(self, text):
        seg_list = [x.translate(self.translator) for x in jieba.cut(text, cut_all=False)]
        return self.sp.encode(" ".join(seg_list))

    def decode(self, tokens):
        text = self.sp.decode(tokens)
        return text.replace(" ", "").replace("\u2582", " ").replace("\u2583", "\n")


def _corpus(tmp_path_factory, documents, name="corpus"):
    directory = tmp_path_factory.mktemp(name)
    (directory / "train.json").write_text(json.dumps(documents, ensure_ascii=False), encoding="utf-8")
    return directory / "train.json"


# --- BERT vocab.txt --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def english_documents(shared_data):
    return list(formats.read_documents([str(shared_data / "wikitext" / "wt-raw" / "wiki.test.raw")], "wikitext"))[:20]


@pytest.fixture(scope="module")
def wordpiece_vocab(english_documents):
    """A 3000-id uncased WordPiece vocabulary trained on WikiText and the Chinese documents."""
    return train_wordpiece(english_documents + CHINESE * 3, 3000, lowercase=True)


def _bert_reference(directory):
    return transformers.BertTokenizerFast.from_pretrained(str(directory))


@pytest.mark.parametrize("lowercase", [True, False])
def test_vocab_txt_ids_equal_bert_tokenizer_fast(tmp_path, wordpiece_vocab, english_documents, lowercase):
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in wordpiece_vocab), encoding="utf-8")
    if not lowercase:
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    ours, reference = load_tokenizer(tmp_path), _bert_reference(tmp_path)
    assert (ours.vocab_size, ours.eod_id) == (len(wordpiece_vocab), wordpiece_vocab.index("[SEP]"))
    documents = english_documents + CHINESE + ENGLISH_EDGE_CASES
    assert ours.encode_batch(documents) == [reference.encode(d, add_special_tokens=False) for d in documents]
    assert load_tokenizer(tmp_path / "vocab.txt").encode_batch(documents) == ours.encode_batch(documents)
    assert (ours.encode("Hello World") != ours.encode("hello world")) == (not lowercase)


def test_a_bare_vocab_txt_is_lower_cased_as_transformers_default(tmp_path, wordpiece_vocab):
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in wordpiece_vocab), encoding="utf-8")
    ours = load_tokenizer(tmp_path / "vocab.txt")
    assert ours.encode("HELLO World") == ours.encode("hello world") == \
        _bert_reference(tmp_path).encode("HELLO World", add_special_tokens=False)


def test_wordpiece_decoding_joins_pieces_and_writes_chinese_without_spaces(tmp_path, wordpiece_vocab):
    (tmp_path / "vocab.txt").write_text("".join(f"{t}\n" for t in wordpiece_vocab), encoding="utf-8")
    ours, reference = load_tokenizer(tmp_path), _bert_reference(tmp_path)
    for text in CHINESE:  # every character is in the vocabulary, and nothing in them is lower-cased
        flat = text.replace("\n", "").replace("  ", "")
        if any(c.isascii() and c.isalnum() for c in flat):
            continue
        assert ours.decode(ours.encode(text)) == flat
    english = "the tokenization of unbelievably long words, isn't it?"
    ids = ours.encode(english)
    assert any(reference.convert_ids_to_tokens(i).startswith("##") for i in ids)  # pieces were joined
    assert ours.decode(ids) == reference.decode(ids)
    assert ours.decode(ids).startswith("the tokenization of unbelievably long words, isn")
    assert ours.decode(ours.encode("北京 天安门")) == "北京天安门"
    assert ours.decode(ours.encode("我爱 python 数据")) == "我爱 python 数据"


def test_a_vocab_txt_without_bert_specials_is_one_line_naming_the_file(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\nhello\nworld\n")
    with pytest.raises(UserError) as error:
        load_tokenizer(tmp_path)
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / "vocab.txt") in message and "it lacks [SEP], [MASK]" in message
    assert "train_tokenizer --type=wordpiece" in message


@pytest.mark.system
def test_train_tokenizer_wordpiece_writes_a_vocab_txt_that_transformers_reads(tmp_path_factory, tmp_path):
    corpus = _corpus(tmp_path_factory, CHINESE + ENGLISH_EDGE_CASES * 5)
    done = train_tokenizer(f"--input={corpus}", "--type=wordpiece", f"--output={tmp_path / 'vocab.txt'}",
                           "--vocab_size=400", "--nolowercase")
    assert done.returncode == 0, done.stderr[-2000:]
    vocab = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and f"wordpiece, {len(vocab)} ids" in done.stdout
    ours, reference = load_tokenizer(tmp_path), _bert_reference(tmp_path)
    assert ours.encode("Hello World") != ours.encode("hello world")  # --nolowercase recorded beside it
    assert ours.encode_batch(CHINESE) == [reference.encode(d, add_special_tokens=False) for d in CHINESE]


@pytest.mark.system
def test_character_vocabulary_is_gpt2_chinese_make_vocab(tmp_path_factory, tmp_path):
    corpus = _corpus(tmp_path_factory, CHINESE)
    done = train_tokenizer(f"--input={corpus}", "--type=char", f"--output={tmp_path / 'vocab.txt'}",
                           "--min_count=2")
    assert done.returncode == 0, done.stderr[-2000:]
    vocab = (tmp_path / "vocab.txt").read_text(encoding="utf-8").splitlines()
    counts = {}
    for text in CHINESE:
        for c in text.lower():
            counts[c] = counts.get(c, 0) + 1
    frequent = {c for c, n in counts.items() if n >= 2 and not c.isspace()}
    singles = [t for t in vocab[5:] if not t.startswith("##")]
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and set(singles) == frequent
    assert counts[singles[0]] == max(counts[c] for c in frequent)  # most frequent first
    ours, reference = load_tokenizer(tmp_path / "vocab.txt"), _bert_reference(tmp_path)
    assert ours.eod_id == 3  # [SEP] ends a document: the vocabulary has neither </s> nor <|endoftext|>
    assert ours.encode_batch(CHINESE) == [reference.encode(d, add_special_tokens=False) for d in CHINESE]
    known = "".join(c for c in "床前明月光，疑是地上霜。举头望明月，低头思故乡。" if c in frequent)
    assert len(known) > 8 and ours.decode(ours.encode(known)) == known
    assert ours.encode("霜") == [1]  # seen once: below --min_count, [UNK]
    assert character_vocabulary(["ab ab"], 100, 1, True)[5:] == ["a", "b", "##b"]


# --- CPM --------------------------------------------------------------------------------------------------------

CPM_DOCUMENTS = CHINESE + [
    "  前后有空格  ", "换行\n\n\n三个", "数字 12345 和 English words, mixed 在一起。", "tab\t分隔\t的文本",
    "全角　空格和半角 空格", "",
]


@pytest.fixture(scope="module")
def cpm_folder(tmp_path_factory):
    """A CPM-layout tokenizer trained by `train_tokenizer --type=cpm`, with added tokens past its pieces."""
    corpus = _corpus(tmp_path_factory, CHINESE * 4 + ENGLISH_EDGE_CASES)
    folder = tmp_path_factory.mktemp("cpm")
    done = train_tokenizer(f"--input={corpus}", "--type=cpm", f"--output={folder / 'spiece.model'}",
                           "--vocab_size=590")
    assert done.returncode == 0, done.stderr[-2000:]
    return folder


@pytest.mark.system
def test_cpm_ids_and_decoding_equal_cpm_generate(cpm_folder):
    ours, reference = load_tokenizer(cpm_folder), CpmGenerateTokenizer(cpm_folder / "spiece.model")
    assert type(ours).__name__ == "CpmTokenizer" and ours.eod_id == reference.sp.piece_to_id("<eod>")
    expected = [reference.encode(d) for d in CPM_DOCUMENTS]
    assert ours.encode_batch(CPM_DOCUMENTS) == expected
    assert any(reference.sp.piece_to_id("\u2582") in ids or "\u2582" in reference.sp.decode(ids) for ids in expected)
    assert [ours.decode(ids) for ids in expected] == [reference.decode(ids) for ids in expected]
    for text in ("  前后有空格  ", "换行\n\n\n三个", "北京 是 首都\n上海"):  # spaces and newlines come back
        assert ours.decode(ours.encode(text)) == text


@pytest.mark.system
def test_cpm_added_tokens_are_ids_and_eod_ends_documents(tmp_path, cpm_folder):
    shutil.copy(cpm_folder / "spiece.model", tmp_path / "spiece.model")
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "spiece.model")).get_piece_size()
    added = {str(pieces + i): {"content": token, "special": True} for i, token in enumerate(["<eot>", "<sep2>"])}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "CpmTokenizer",
                                                                "added_tokens_decoder": added}))
    ours = load_tokenizer(tmp_path)
    assert ours.vocab_size == pieces + 2 and ours.token_to_id("<sep2>") == pieces + 1
    ids = ours.encode("你好<eot>世界<eod>")
    assert pieces in ids and ours.eod_id in ids and ours.decode(ids) == "你好<eot>世界<eod>"
    decoded = ours.decode(list(range(ours.vocab_size)) + [ours.vocab_size + 5])  # every id decodes, none raises
    assert "<eot><sep2>" in decoded
    documents, lengths = ours.encode_documents(["你好", "世界"], append_eod=True)
    assert documents[lengths[0] - 1] == documents[-1] == ours.eod_id


@pytest.mark.system
def test_cpm_prefix_picks_the_cpm_tokenizer_for_a_bare_model(cpm_folder, tmp_path):
    shutil.copy(cpm_folder / "spiece.model", tmp_path / "spiece.model")
    plain = load_tokenizer(tmp_path / "spiece.model")
    cpm = load_tokenizer(f"cpm:{tmp_path / 'spiece.model'}")
    text = CPM_DOCUMENTS[1]
    assert cpm.encode(text) == CpmGenerateTokenizer(tmp_path / "spiece.model").encode(text) != plain.encode(text)
    assert cpm.sha256 != plain.sha256 and cpm.path == f"cpm:{tmp_path / 'spiece.model'}"
    assert load_tokenizer(cpm.path).encode(text) == cpm.encode(text)  # the recorded path loads again
    with pytest.raises(UserError, match=r"cpm:.*spiece\.model"):
        load_tokenizer(f"cpm:{tmp_path / 'missing'}")


@pytest.mark.system
def test_missing_jieba_is_one_line_naming_the_extra(cpm_folder, monkeypatch):
    monkeypatch.setitem(sys.modules, "jieba", None)
    with pytest.raises(UserError) as error:
        load_tokenizer(cpm_folder)
    assert "\n" not in str(error.value) and "t5x_like[chinese]" in str(error.value)


@pytest.mark.system
def test_train_tokenizer_cpm_names_the_smallest_size(tmp_path_factory, tmp_path):
    corpus = _corpus(tmp_path_factory, CHINESE)
    done = train_tokenizer(f"--input={corpus}", "--type=cpm", f"--output={tmp_path / 'spiece.model'}",
                           "--vocab_size=270")  # above what any corpus needs (266), below this one's need
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "error: --vocab_size=270: this corpus needs at least" in done.stderr


# --- conversion keeps the tokenizer ----------------------------------------------------------------------------

def _hf_folder(random_hf_gpt2, tmp_path, vocab_size, eod_id=0, scale=0.01):
    model = random_hf_gpt2(scale)
    model.resize_token_embeddings(vocab_size)
    model.config.update({"vocab_size": vocab_size, "bos_token_id": eod_id, "eos_token_id": eod_id})
    model.save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


@pytest.mark.system
def test_from_hf_and_to_hf_keep_a_cpm_tokenizer(random_hf_gpt2, cpm_folder, tmp_path):
    from t5x_like.convert import hf

    tokenizer = load_tokenizer(cpm_folder)
    folder = _hf_folder(random_hf_gpt2, tmp_path, tokenizer.vocab_size)
    for name in ("spiece.model", "tokenizer_config.json"):
        shutil.copy(cpm_folder / name, folder / name)
    hf.from_hf(str(folder), str(tmp_path / "ours"))
    imported = load_tokenizer(loading.read_config(str(tmp_path / "ours"))[1])
    assert type(imported).__name__ == "CpmTokenizer"
    assert imported.encode_batch(CPM_DOCUMENTS) == tokenizer.encode_batch(CPM_DOCUMENTS)
    hf.to_hf(str(tmp_path / "ours"), str(tmp_path / "back"))
    config = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "CpmTokenizer" and config["eos_token"] == "<eod>"
    exported = load_tokenizer(tmp_path / "back")
    assert exported.encode_batch(CPM_DOCUMENTS) == tokenizer.encode_batch(CPM_DOCUMENTS)
    assert exported.sha256 == tokenizer.sha256


def test_from_hf_and_to_hf_keep_a_vocab_txt(random_hf_gpt2, tmp_path):
    from t5x_like.convert import hf

    vocab = character_vocabulary(CHINESE, 1000, 1, lowercase=False)
    folder = _hf_folder(random_hf_gpt2, tmp_path, len(vocab))
    write_vocab_txt(vocab, str(folder / "vocab.txt"), lowercase=False)
    hf.from_hf(str(folder), str(tmp_path / "ours"))
    imported = load_tokenizer(loading.read_config(str(tmp_path / "ours"))[1])
    assert imported.encode_batch(CHINESE) == load_tokenizer(folder / "vocab.txt").encode_batch(CHINESE)
    hf.to_hf(str(tmp_path / "ours"), str(tmp_path / "back"))
    config = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())
    assert (config["tokenizer_class"], config["do_lower_case"], config["unk_token"]) == ("BertTokenizer", False, "[UNK]")
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "back"))
    assert imported.encode_batch(CHINESE) == [reference.encode(d, add_special_tokens=False) for d in CHINESE]


@pytest.mark.system
def test_a_cpm_folder_converts_and_decodes_greedily_like_gpt2lmheadmodel(random_hf_gpt2, cpm_folder, tmp_path):
    """A CPM-Generate-layout folder: from-hf, then `generate --temperature=0` equals transformers' greedy
    GPT2LMHeadModel fed with CPM-Generate's ids of the prompt, and the completion is their decoding."""
    import torch

    from t5x_like.convert import hf
    from tests.support.environment import cpu_env

    tokenizer = load_tokenizer(cpm_folder)
    folder = _hf_folder(random_hf_gpt2, tmp_path, tokenizer.vocab_size, tokenizer.eod_id, scale=0.5)
    for name in ("spiece.model", "tokenizer_config.json"):
        shutil.copy(cpm_folder / name, folder / name)
    hf.from_hf(str(folder), str(tmp_path / "ours"))
    prompt, new = "北京 是中国的\n首都", 12
    done = subprocess.run([sys.executable, "-m", "t5x_like.generate", f"--checkpoint={tmp_path / 'ours'}",
                           f"--prompt={prompt}", f"--max_new_tokens={new}", "--temperature=0"], cwd=REPO,
                          env=cpu_env(1), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ours = json.loads(done.stdout.strip().splitlines()[-1])
    reference = CpmGenerateTokenizer(cpm_folder / "spiece.model")
    ids = reference.encode(prompt)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=new, eos_token_id=tokenizer.eod_id,
                             pad_token_id=tokenizer.eod_id)
    theirs = out[0, len(ids):].tolist()
    theirs = theirs[:theirs.index(tokenizer.eod_id)] if tokenizer.eod_id in theirs else theirs
    assert ours["tokens"] == theirs and len(set(theirs)) > 1
    assert ours["completion"] == reference.decode(theirs)


def test_a_bert_tokenizer_json_ends_documents_with_sep_and_decodes_chinese_without_spaces(tmp_path):
    vocab = character_vocabulary(CHINESE, 1000, 1, lowercase=True)
    write_vocab_txt(vocab, str(tmp_path / "vocab.txt"), lowercase=True)
    bert_wordpiece(str(tmp_path / "vocab.txt")).save(str(tmp_path / "tokenizer.json"))
    ours = load_tokenizer(tmp_path / "tokenizer.json")
    assert ours.eod_id == vocab.index("[SEP]")
    assert ours.decode(ours.encode(CHINESE[0])) == CHINESE[0]
