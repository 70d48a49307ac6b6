"""CPM-2 from and to ModelCenter's folders: a tiny ModelCenter CPM-2 (config.json, pytorch_model.pt in float16,
the real vocab.txt) converts with from-modelcenter; generate on a Chinese prompt with English words and a newline
records ModelCenter's CPM2Tokenizer's ids as prompt_tokens and greedily decodes, after [<s>, <s_0>], the 16 tokens
transformers' T5 with the exact GELU decodes from the same weights; to-modelcenter gives back the same tensors."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
pytest.importorskip("jieba", reason="needs the chinese extra (jieba)")

from t5x_like import generate  # noqa: E402
from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.inference import loading  # noqa: E402
from tests.support import cpm2  # noqa: E402
from tests.support.shared_data import needs_shared, shared_file  # noqa: E402

pytestmark = needs_shared("cpm2", "vocab.txt")
PROMPT = "清华大学的 CPM-2 模型\n可以写 English words 和中文。"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    vocab = shared_file("cpm2", "vocab.txt")
    root = tmp_path_factory.mktemp("cpm2")
    model = cpm2.reference_t5(vocab_size=26240)
    written = cpm2.write_modelcenter_folder(model, root / "modelcenter", vocab)
    cli.main(["from-modelcenter", str(root / "modelcenter"), str(root / "ours")])
    return root, model, written, vocab


def test_generate_records_modelcenters_ids_and_decodes_as_transformers_t5_with_the_exact_gelu(converted, tmp_path):
    root, model, _, vocab = converted
    [record] = generate.main(["--checkpoint", str(root / "ours"), "--prompt", PROMPT, "--temperature=0",
                              f"--max_new_tokens={NEW_TOKENS}", "--output", str(tmp_path / "out.jsonl")])
    reference = cpm2.ModelCenterCPM2Tokenizer(str(vocab))
    ids = reference.encode(PROMPT)
    assert record["prompt_tokens"] == ids
    assert reference.line_id in ids and reference.space_id in ids  # the newline and the spaces are tokens
    start = [1, reference.get_sentinel_id(0)]
    assert start == [1, 26050]
    want = cpm2.greedy(model, ids, start, NEW_TOKENS, stop=7)  # the encoder reads the ids alone
    assert len(want) == NEW_TOKENS
    assert record["tokens"] == want
    assert json.loads((tmp_path / "out.jsonl").read_text(encoding="utf-8"))["prompt_tokens"] == ids


def test_to_modelcenter_gives_back_the_same_tensors_config_and_vocabulary(converted, tmp_path):
    root, _, written, vocab = converted
    cli.main(["to-modelcenter", str(root / "ours"), str(tmp_path / "back")])
    back = torch.load(tmp_path / "back" / "pytorch_model.pt", weights_only=True)
    assert sorted(back) == sorted(written)
    for name, tensor in back.items():
        assert tensor.dtype == torch.float16, name
        np.testing.assert_array_equal(tensor.numpy(), written[name], err_msg=name)
    assert (tmp_path / "back" / "vocab.txt").read_bytes() == vocab.read_bytes()
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    original = json.loads((root / "modelcenter" / "config.json").read_text())
    assert {k: config[k] for k in original} == original


def test_the_checkpoint_records_cpm2s_tokenizer(converted):
    root, *_ = converted
    config, _ = loading.read_config(str(root / "ours"))
    tokenizer = loading.checkpoint_tokenizer(str(root / "ours"), config)
    assert (config.family, type(tokenizer).__name__, tokenizer.vocab_size) == ("cpm2", "CPM2Tokenizer", 26240)


def test_another_models_modelcenter_config_is_refused_in_one_line(converted, tmp_path, capsys):
    root, *_ = converted
    folder = tmp_path / "other"
    folder.mkdir()
    (folder / "pytorch_model.pt").write_bytes((root / "modelcenter" / "pytorch_model.pt").read_bytes())
    (folder / "config.json").write_text(json.dumps({"ffn_activate_fn": "relu"}))
    with pytest.raises(SystemExit):
        from t5x_like.errors import exit_on_user_error
        exit_on_user_error(cli.main)(["from-modelcenter", str(folder), str(tmp_path / "out")])
    assert "ffn_activate_fn='relu'" in capsys.readouterr().err


def test_to_modelcenter_refuses_a_folder_in_use_naming_overwrite_which_replaces_it(converted, tmp_path, capsys):
    from t5x_like.errors import exit_on_user_error

    root, _, written, _ = converted
    folder = tmp_path / "back"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(SystemExit):
        exit_on_user_error(cli.main)(["to-modelcenter", str(root / "ours"), str(folder)])
    err = capsys.readouterr().err
    assert "to-modelcenter writes into a new or empty folder" in err and "add --overwrite" in err
    assert "Traceback" not in err and (folder / "config.json").read_text() == "{}"
    cli.main(["to-modelcenter", str(root / "ours"), str(folder), "--overwrite"])
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 26240
    assert sorted(torch.load(folder / "pytorch_model.pt", weights_only=True)) == sorted(written)


def test_to_modelcenter_of_a_model_on_another_tokenizer_is_refused_before_writing(converted, tmp_path, capsys):
    """The CPM-2 quickstart's model follows the builtin corpus's BPE, which ModelCenter's CPM2Tokenizer cannot read:
    refused in one line, nothing written (was: config.json and pytorch_model.pt written, then "convert again")."""
    import dataclasses

    from t5x_like.checkpoint import store
    from t5x_like.convert import hf
    from t5x_like.data import load_tokenizer
    from t5x_like.data.builtin import builtin_corpus
    from t5x_like.data.tokenizer_files import tokenizer_record
    from t5x_like.errors import exit_on_user_error

    builtin_tokenizer = builtin_corpus()[1]
    root, *_ = converted
    config, _ = loading.read_config(str(root / "ours"))
    record = tokenizer_record(load_tokenizer(builtin_tokenizer))
    store.save_params(str(tmp_path / "bpe_run"), 0, hf.restore_on_host(str(root / "ours"), config),
                      {"config": dataclasses.asdict(config), "tokenizer": record})
    with pytest.raises(SystemExit):
        exit_on_user_error(cli.main)(["to-modelcenter", str(tmp_path / "bpe_run"), str(tmp_path / "back")])
    err = capsys.readouterr().err
    assert "records a tokenizer that is not a CPM-2 vocab.txt" in err and "export it with to-hf" in err, err
    assert "Traceback" not in err and not (tmp_path / "back").exists()
    with pytest.raises(SystemExit):  # --tokenizer must be a CPM-2 vocab.txt too
        exit_on_user_error(cli.main)(["to-modelcenter", str(root / "ours"), str(tmp_path / "back"),
                                      f"--tokenizer={builtin_tokenizer}"])
    assert "is not a CPM-2 vocab.txt" in capsys.readouterr().err and not (tmp_path / "back").exists()


def test_to_modelcenter_takes_the_vocabulary_from_tokenizer_when_the_checkpoint_records_none(converted, tmp_path,
                                                                                            capsys):
    root, _, _, vocab = converted
    (tmp_path / "novocab").mkdir()
    for name in ("config.json", "pytorch_model.pt"):
        (tmp_path / "novocab" / name).write_bytes((root / "modelcenter" / name).read_bytes())
    cli.main(["from-modelcenter", str(tmp_path / "novocab"), str(tmp_path / "ours")])
    assert "has no tokenizer files (vocab.txt), so the checkpoint records none" in capsys.readouterr().err
    cli.main(["to-modelcenter", str(tmp_path / "ours"), str(tmp_path / "plain")])
    assert "note: no vocab.txt written" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == ["config.json", "pytorch_model.pt"]
    cli.main(["to-modelcenter", str(tmp_path / "ours"), str(tmp_path / "back"), f"--tokenizer={vocab}"])
    assert (tmp_path / "back" / "vocab.txt").read_bytes() == vocab.read_bytes()
