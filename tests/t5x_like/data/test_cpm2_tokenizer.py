"""CPM-2's tokenizer, id for id with ModelCenter's CPM2Tokenizer (transcribed in tests/support/cpm2.py) over
CPM-2's real vocab.txt: Chinese, English, digits, spaces, newlines, unknown characters (a sentinel written in text
is its id); recognised from the vocab.txt (file or folder), a plain BERT vocab.txt still BERT's."""
import pytest

pytest.importorskip("jieba", reason="needs the chinese extra (jieba)")

from t5x_like.data.cpm2_tokenizer import CPM2Tokenizer  # noqa: E402
from t5x_like.data.tokenizer import load_tokenizer  # noqa: E402
from t5x_like.errors import UserError  # noqa: E402
from tests.support import cpm2  # noqa: E402
from tests.support.shared_data import needs_shared, shared_file  # noqa: E402

pytestmark = needs_shared("cpm2", "vocab.txt")
TEXTS = [
    "今天天气不错，我们去公园散步吧。",
    "清华大学的 CPM-2 模型有 110 亿参数\n第二行：Hello, World!  两个空格",
    "2021年6月 the quick brown fox jumps over 13 lazy dogs; 数字3.14159和1,000,000",
    "未知字符☃🙂\t制表符 and ▂ and ▃ 已映射",
    "  \n\n 开头的空白和结尾的空白 \n",
    "<eod> 和 <s> 只是文字",
    "ＦＵＬＬ　ｗｉｄｔｈ，全角！",
    "",
]


@pytest.fixture(scope="module")
def both():
    vocab = shared_file("cpm2", "vocab.txt")
    return load_tokenizer(str(vocab.parent)), cpm2.ModelCenterCPM2Tokenizer(str(vocab))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_and_decoding_are_modelcenters(both, text):
    ours, reference = both
    ids = ours.encode(text)
    assert ids == reference.encode(text)
    assert ours.decode(ids) == reference.decode(ids)


@pytest.mark.parametrize("text, parts", [
    ("“天气”与“气候”的意思<s_0>", ["“天气”与“气候”的意思", 0]),  # CPM-2-Finetune's LCQMC inputs
    ("<s_0> 和 <s_189>，<s_190> 不是", [0, " 和 ", 189, "，<s_190> 不是"]),
])
def test_a_sentinel_in_text_is_its_id_and_the_rest_modelcenters(both, text, parts):
    """ModelCenter's encode cuts `<s_0>` into five pieces; CPM-2-Finetune puts get_sentinel_id(0) in by hand, and
    here the text's `<s_0>` is that id (as T5's `<extra_id_0>`), the text between encoded as ModelCenter does."""
    ours, reference = both
    want = [i for part in parts for i in ([reference.get_sentinel_id(part)] if isinstance(part, int) else
                                          reference.encode(part))]
    assert ours.encode(text) == want
    assert ours.decode(want) == text


def test_sizes_specials_and_sentinels_are_modelcenters(both):
    ours, reference = both
    assert isinstance(ours, CPM2Tokenizer)
    assert ours.vocab_size == reference.vocab_size == 26240
    assert [ours.sentinel_id(i) for i in (0, 1, 189)] == [reference.get_sentinel_id(i) for i in (0, 1, 189)] == \
        [26050, 26051, 26239]
    assert (ours.eod_id, ours.token_to_id("<s>"), ours.token_to_id("\u2582"), ours.token_to_id("\u2583")) == \
        (7, 1, reference.space_id, reference.line_id)
    assert ours.encode("☃") == [ours.unk_id]


def test_the_file_and_a_saved_copy_load_as_cpm2s(both, tmp_path):
    vocab = shared_file("cpm2", "vocab.txt")
    assert isinstance(load_tokenizer(str(vocab)), CPM2Tokenizer)
    ours, _ = both
    for name, data in ours.hf_files().items():
        (tmp_path / name).write_bytes(data)
    again = load_tokenizer(str(tmp_path))
    assert isinstance(again, CPM2Tokenizer) and again.sha256 == ours.sha256


def test_a_bert_vocabulary_is_still_berts(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n你\n好\n<s_189>\n", encoding="utf-8")
    assert not isinstance(load_tokenizer(str(tmp_path)), CPM2Tokenizer)


@pytest.mark.parametrize("damage, says", [
    (lambda lines: lines[:-1], "it lacks <s_189>"),  # the last line lost
    (lambda lines: [line for line in lines if line != "<eod>"], "it lacks <eod>"),
    (lambda lines: lines + ["extra"], "pieces follow <s_189> (the first: 'extra')"),
])
def test_a_damaged_cpm2_vocabulary_says_what_cpm2s_holds(tmp_path, damage, says):
    """It was read as BERT's and refused for lacking [UNK] ...; now the line names CPM-2's vocabulary."""
    lines = shared_file("cpm2", "vocab.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "vocab.txt").write_text("\n".join(damage(lines)) + "\n", encoding="utf-8")
    with pytest.raises(UserError) as refused:
        load_tokenizer(str(tmp_path))
    assert str(refused.value) == (
        f"{tmp_path / 'vocab.txt'}: not CPM-2's vocabulary: {says}; CPM-2's vocab.txt holds <unk>, <s>, <eod>, "
        "<pad>, \u2582, \u2583 and ends with the 190 sentinels <s_0> ... <s_189> (CPM-2-Finetune's bpe_cn/vocab.txt, "
        "the vocab.txt of ModelCenter's cpm2 folders). Give that file, or a folder holding it.")
