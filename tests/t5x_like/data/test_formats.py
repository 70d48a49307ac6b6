import gzip
import json

import pytest
import zstandard

from t5x_like.data import formats
from t5x_like.data.formats import InputError, expand_inputs, read_documents


def read(paths, fmt="auto", keys=("text",), errors="strict"):
    return list(read_documents(expand_inputs([str(p) for p in paths]), fmt, keys, errors))


def test_text_files_plain_and_gzip_are_one_document_each(tmp_path):
    (tmp_path / "a.txt").write_text("first book\nline two\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("second book")
    assert read([tmp_path]) == ["first book\nline two\n", "second book"]


def test_jsonl_zst_with_several_keys(tmp_path):
    lines = [json.dumps({"title": f"T{i}", "text": f"body {i}", "meta": {"x": i}}) for i in range(3)]
    (tmp_path / "00.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("\n".join(lines).encode()))
    assert read([tmp_path / "00.jsonl.zst"], keys=("title", "text")) == [f"T{i}\n\nbody {i}" for i in range(3)]


def test_json_extension_with_objects_per_line_is_jsonl(tmp_path):
    (tmp_path / "c.json").write_text('{"text": "a"}\n\n{"text": "b"}\n')
    assert formats.detect_format(str(tmp_path / "c.json")) == "jsonl"
    assert read([tmp_path / "c.json"]) == ["a", "b"]


@pytest.mark.parametrize("chunk", [3, 7, 1 << 20])
def test_json_array_is_read_incrementally(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(formats, "_CHUNK", chunk)
    values = ["中文 text, with \"quotes\" and ] brackets", "", "second\nline", {"text": "an object", "n": [1, 2]}]
    (tmp_path / "train.json").write_text(" [\n" + ",\n  ".join(json.dumps(v, ensure_ascii=False) for v in values)
                                         + "\n]\n", encoding="utf-8")
    assert formats.detect_format(str(tmp_path / "train.json")) == "json_array"
    assert read([tmp_path / "train.json"]) == [values[0], values[2], "an object"]


def test_empty_json_array_is_an_empty_file_error(tmp_path):
    (tmp_path / "train.json").write_text("[ ]")
    with pytest.raises(InputError, match=r"train\.json: no documents \(empty file\?\)"):
        read([tmp_path / "train.json"])


@pytest.mark.parametrize("text, line, message", [
    ('["a",\n"b"\n"c"]', 3, "expected ',' or ']'"),
    ('["a",\n\n{"text": }]', 3, "invalid JSON"),
    ('["a",\n"b"', 2, "expected ',' or ']'.*end of the file"),
    ('{"a": 1}', 1, "expected a JSON array"),
])
def test_malformed_json_array_names_the_line(tmp_path, monkeypatch, text, line, message):
    monkeypatch.setattr(formats, "_CHUNK", 4)
    (tmp_path / "bad.json").write_text(text)
    with pytest.raises(InputError, match=rf"bad\.json:{line}: {message}"):
        read([tmp_path / "bad.json"], fmt="json_array")


def test_wikiextractor_nested_directories_doc_and_json_output(tmp_path):
    (tmp_path / "text" / "AA").mkdir(parents=True)
    (tmp_path / "text" / "AB").mkdir()
    (tmp_path / "text" / "AA" / "wiki_00").write_text(
        '<doc id="1" url="u" title="Alpha">\nAlpha\n\nAlpha is first.\n</doc>\n'
        '<doc id="2" url="u" title="Beta">\nBeta\n\nBeta is second.\n</doc>\n')
    (tmp_path / "text" / "AB" / "wiki_01.gz").write_bytes(
        gzip.compress(b'{"id": "3", "url": "u", "title": "Gamma", "text": "Gamma is third."}\n'))
    assert read([tmp_path / "text"]) == ["Alpha\n\nAlpha is first.", "Beta\n\nBeta is second.", "Gamma is third."]


def test_wikiextractor_unclosed_doc_is_an_error(tmp_path):
    (tmp_path / "wiki_00").write_text('<doc id="1">\nAlpha\n')
    with pytest.raises(InputError, match=r"wiki_00:1: '<doc' without a closing '</doc>'"):
        read([tmp_path / "wiki_00"])


def test_wikitext_splits_articles_at_top_level_titles(tmp_path):
    (tmp_path / "wiki.train.tokens").write_text(
        " \n = Alpha = \n \n Alpha text . \n \n = = Section = = \n \n More . \n \n = Beta = \n \n Beta text . \n")
    assert read([tmp_path]) == [" = Alpha = \n \n Alpha text . \n \n = = Section = = \n \n More . \n \n",
                                " = Beta = \n \n Beta text . \n"]


def test_globs_and_directories_expand_sorted(tmp_path):
    for name in ("b.txt", "a.txt", "sub/c.txt", ".hidden.txt"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(name)
    assert read([tmp_path]) == ["a.txt", "b.txt", "sub/c.txt"]
    assert expand_inputs([str(tmp_path / "*.txt"), str(tmp_path / "sub")]) == [
        str(tmp_path / "a.txt"), str(tmp_path / "b.txt"), str(tmp_path / "sub" / "c.txt")]
    with pytest.raises(InputError, match=r"--input=.*nope\*: no such file, directory or matching glob"):
        expand_inputs([str(tmp_path / "nope*")])


def test_empty_file_is_an_error(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(InputError, match=r"empty\.jsonl: no documents \(empty file\?\); remove it"):
        read([tmp_path / "empty.jsonl"])


def test_malformed_json_line_names_file_and_line(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "ok"}\n{"text": "broken}\n')
    with pytest.raises(InputError, match=r"d\.jsonl:2: invalid JSON at column 10 \(Unterminated string"):
        read([tmp_path / "d.jsonl"])


def test_missing_text_key_names_the_keys_and_the_flag(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"text": "ok"}\n{"content": "x", "id": 1}\n')
    with pytest.raises(InputError, match=r"d\.jsonl:2: no key 'text' \(keys: content, id\); pass --json_keys="):
        read([tmp_path / "d.jsonl"])


def test_undecodable_bytes_error_or_replace(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"d\.jsonl:2: bytes that are not UTF-8.*--decode_errors=replace"):
        read([tmp_path / "d.jsonl"])
    assert read([tmp_path / "d.jsonl"], errors="replace") == ["fine", "caf\ufffd"]


def test_unknown_file_name_asks_for_format(tmp_path):
    (tmp_path / "corpus.dat").write_text("x")
    with pytest.raises(InputError, match=r"corpus\.dat: cannot tell the format from the name; pass --format="):
        read([tmp_path / "corpus.dat"])
    assert read([tmp_path / "corpus.dat"], fmt="text") == ["x"]
