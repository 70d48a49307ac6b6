"""preprocess with a tokenizer whose users get a beginning-of-text token first (a Llama tokenizer.json's
post-processor; here GPT-NeoX's 20B tokenizer plus `<s>`, saved as transformers saves it): each document is
written as Megatron-LM's tools/preprocess_data.py writes it with `--tokenizer-type HuggingFaceTokenizer
--tokenizer-model FOLDER` (its HuggingFaceTokenizer encodes `tokenizer(text).input_ids`, BOS first), i.e.
transformers' `AutoTokenizer.from_pretrained(FOLDER)(text)["input_ids"]`, + the end-of-document id with
--append_eod; `--no_bos` gives the ids without it (Megatron's `--tokenizer-hf-no-include-special-tokens`). GPT-2
BPE, which has no BOS, is written as before (transformers' GPT-2 tokenizer + EOD). The causal-LM loader packs a
BOS document like any other: the BOS opens its segment at position 0 and is an ordinary input.

With MEGATRON_LM set to a Megatron-LM checkout (tools/preprocess_data.py), Megatron's own script runs on the same
corpus (with scripts/megatron_shims, as scripts/benchmark_preprocess.py runs it) and the .bin/.idx are compared
byte for byte, with and without BOS."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.data import loader, open_token_file  # noqa: E402
from tests.support.hf_models import bos_tokenizer  # noqa: E402
from tests.support.shared_data import shared_file  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
MEGATRON = os.environ.get("MEGATRON_LM")
TEXTS = ["Hello world.", "The quick brown fox\n\njumps over the lazy dog.", " a leading space and a trailing one ",
         "Ünïcödé — 中文 text", "a literal <s> and <|endoftext|> inside", "x"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A folder of its own holding tok/ (the BOS tokenizer as transformers saves it) and corpus.jsonl; skips
    without GPT-NeoX's tokenizer in ../shared/data, the base of the BOS tokenizer."""
    root = tmp_path_factory.mktemp("preprocess_bos")
    bos_tokenizer(str(root / "tok"))
    (root / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS), encoding="utf-8")
    return root


def preprocess(cwd: Path, prefix: str, tokenizer: str, *flags: str) -> list[str]:
    """Runs the CLI as users do (relative paths, from `cwd`); its stdout lines (the summary)."""
    done = subprocess.run([sys.executable, "-m", "t5x_like.data.preprocess", "--input=corpus.jsonl",
                           f"--output_prefix={prefix}", f"--tokenizer={tokenizer}", "--workers=1", *flags],
                          cwd=cwd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def documents(prefix: Path) -> list[list[int]]:
    file = open_token_file(prefix)
    return [file.document(i).tolist() for i in range(file.num_documents)]


@pytest.fixture(scope="module")
def bos_files(work):
    """out/bos (defaults), out/no_bos (--no_bos), out/bos_no_eod (--noappend_eod) and their summaries."""
    return {name: preprocess(work, f"out/{name}", "tok", *flags)
            for name, flags in {"bos": (), "no_bos": ("--no_bos",), "bos_no_eod": ("--noappend_eod",)}.items()}


@pytest.mark.system
def test_each_document_starts_with_bos_as_transformers_encodes_it(work, bos_files):
    hf = transformers.AutoTokenizer.from_pretrained(work / "tok")
    bos, eod = hf.bos_token_id, hf.eos_token_id  # Megatron's HuggingFaceTokenizer: eod is the eos_token's id
    assert (bos, eod) == (hf.convert_tokens_to_ids("<s>"), hf.convert_tokens_to_ids("<|endoftext|>"))
    expected = [hf(text)["input_ids"] for text in TEXTS]
    assert all(ids[0] == bos and bos not in ids[1:] for ids in expected[:4])  # the template puts it first
    assert documents(work / "out" / "bos") == [ids + [eod] for ids in expected]
    assert documents(work / "out" / "bos_no_eod") == expected
    assert bos_files["bos"][-1] == f"each document: <s> (BOS, id {bos}), its text, <|endoftext|> (EOD, id {eod}) " \
                                   "(--no_bos leaves the BOS out)"
    assert open_token_file(work / "out" / "bos").metadata["add_bos"] is True


@pytest.mark.system
def test_no_bos_writes_the_documents_without_it(work, bos_files):
    hf = transformers.AutoTokenizer.from_pretrained(work / "tok")
    expected = [hf(text, add_special_tokens=False)["input_ids"] + [hf.eos_token_id] for text in TEXTS]
    assert documents(work / "out" / "no_bos") == expected == [ids[1:] for ids in documents(work / "out" / "bos")]
    assert bos_files["no_bos"][-1] == f"each document: its text, <|endoftext|> (EOD, id {hf.eos_token_id}); " \
                                      f"--no_bos left out <s> (BOS, id {hf.bos_token_id})"
    assert open_token_file(work / "out" / "no_bos").metadata["add_bos"] is False


@pytest.mark.system
def test_gpt2_bpe_has_no_bos_and_is_written_as_before(work):
    gpt2_bpe = shared_file("gpt2-bpe")
    (work / "gpt2").mkdir()  # OpenAI's encoder.json / vocab.bpe under the names transformers reads
    shutil.copyfile(gpt2_bpe / "encoder.json", work / "gpt2" / "vocab.json")
    shutil.copyfile(gpt2_bpe / "vocab.bpe", work / "gpt2" / "merges.txt")
    lines = preprocess(work, "out/gpt2", "gpt2")
    hf = transformers.GPT2TokenizerFast.from_pretrained(work / "gpt2")
    assert documents(work / "out" / "gpt2") == [hf(text)["input_ids"] + [50256] for text in TEXTS]
    assert lines[-1] == "each document: its text, <|endoftext|> (EOD, id 50256); the tokenizer has no " \
                        "beginning-of-text token"
    assert open_token_file(work / "out" / "gpt2").metadata["add_bos"] is False


@pytest.mark.system
def test_packing_treats_bos_as_an_ordinary_first_token(work, bos_files):
    """Packed rows: each document's segment opens with its BOS at position 0; BOS -> first text token counts in
    the loss, a BOS is never a counted target (it starts its segment); segment ids number the documents."""
    file = open_token_file(work / "out" / "bos")
    source = loader.split_rows(file, "train", data_split="1,0,0", seq_len=64, packing=True)
    rows = {key: np.stack([source[i][key] for i in range(len(source))]) for key in ("tokens", "segments", "positions")}
    arrays = loader.packed_arrays(rows)
    inputs, targets = arrays["decoder_input_tokens"], arrays["decoder_target_tokens"]
    weights, segments = arrays["decoder_loss_weights"], arrays["decoder_segment_ids"]
    starts = (rows["positions"] == 0) & (rows["segments"] > 0)  # where each document (its BOS) is in a row
    bos = documents(work / "out" / "bos")[0][0]
    assert starts.sum() == len(TEXTS) and (rows["tokens"][starts] == bos).all()
    assert (weights[starts[:, :-1]] == 1).all() and (inputs[starts[:, :-1]] == bos).all()  # BOS -> first token
    assert (weights[starts[:, 1:]] == 0).all() and (targets[starts[:, 1:]] == bos).all()  # EOD -> next BOS
    lengths = np.diff(file.offsets)
    first_row = segments[0][segments[0] > 0]
    np.testing.assert_array_equal(first_row, np.repeat(np.arange(1, len(TEXTS) + 1), lengths)[:len(first_row)])


@pytest.mark.skipif(not MEGATRON, reason="set MEGATRON_LM to a Megatron-LM checkout to compare with its own "
                                         "tools/preprocess_data.py byte for byte")
@pytest.mark.parametrize("ours, theirs", [("bos", ()), ("no_bos", ("--tokenizer-hf-no-include-special-tokens",))])
@pytest.mark.system
def test_megatron_preprocess_data_writes_the_same_bytes(work, bos_files, ours, theirs):
    (work / "megatron").mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, os.path.join(MEGATRON, "tools", "preprocess_data.py"),
                           "--input", "corpus.jsonl", "--output-prefix", f"megatron/{ours}",
                           "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tok", "--append-eod",
                           "--workers", "1", *theirs], cwd=work, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO / "scripts" / "megatron_shims")))
    assert done.returncode == 0, done.stderr[-3000:]
    for suffix in (".bin", ".idx"):
        assert (work / "out" / f"{ours}{suffix}").read_bytes() == \
            (work / "megatron" / f"{ours}_text_document{suffix}").read_bytes(), suffix
