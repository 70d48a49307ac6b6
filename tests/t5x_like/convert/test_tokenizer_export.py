"""Every tokenizer form training takes exports with `convert to-hf` to a folder that transformers' AutoTokenizer
loads and that encodes exactly as ours, and that loads back as the same tokenizer (same sha256): GPT-2 BPE under
OpenAI's, Hugging Face's and Megatron's file names (a folder, or the vocab file alone), a tokenizer.json, BERT
vocab.txt (WordPiece and characters), T5's spiece.model, a byte-fallback sentencepiece model, CPM's folder.
The checkpoint records a tokenizer, or `--tokenizer` names one; the recorded one is used after its files are gone.
A T5 model's sentinels are its tokenizer's added tokens when the tokenizer class is not T5Tokenizer."""
import dataclasses
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

import models  # noqa: E402
from models.gpt2 import GPT2Config  # noqa: E402
from t5x_like.checkpoint import store  # noqa: E402
from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.convert import hf  # noqa: E402
from t5x_like.data import train_tokenizer  # noqa: E402
from t5x_like.data.tokenizer import load_tokenizer  # noqa: E402
from t5x_like.data.tokenizer_files import tokenizer_record  # noqa: E402
from tests.support.shared_data import shared_file

TEXT = ("Hello world!  It's 2026:\n\tthe  café — naïve résumé, ü and 東京.  Trailing   spaces   \n"
        "def f(x):\n    return x ** 2  # ok\n你好，世界。中文的句子在这里。😀 ☃ <|endoftext|> done")
CHINESE = ["你好，世界。中文的句子在这里。东京很大。", "今天天气不错 我们去公园散步吧。"] * 40


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny GPT-2 checkpoint whose vocabulary holds any of the tokenizers below (50304 rows)."""
    path = tmp_path_factory.mktemp("ours")
    config = GPT2Config(vocab_size=50304, max_len=16, num_layers=1, num_heads=2, embed_dim=8, mlp_dim=16)
    params = nn.meta.unbox(jax.jit(models.build_model(config).init)(jax.random.PRNGKey(0),
                                                                     jnp.zeros((1, 4), jnp.int32))["params"])
    store.save_params(str(path), 1, params, {"config": dataclasses.asdict(config), "tokenizer": None})
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, builtin_texts):
    """Tokenizers train_tokenizer makes (corpus: the builtin documents plus Chinese lines)."""
    root = tmp_path_factory.mktemp("trained")
    texts = builtin_texts[:150] + CHINESE
    for kind, output, size in (("wordpiece", "wp/vocab.txt", 3000), ("char", "char/vocab.txt", 3000),
                               ("sentencepiece", "sp/sp.model", 1500), ("cpm", "cpm/spiece.model", 1500),
                               ("bpe", "bpe/tokenizer.json", 1500)):
        (root / output).parent.mkdir()
        train_tokenizer.train(texts, kind, size, str(root / output))
    return root


def megatron_names(tmp_path):
    """GPT-2's files under the names Megatron's tutorial gives them."""
    folder = tmp_path / "megatron"
    folder.mkdir()
    shutil.copy(shared_file("gpt2-bpe") / "encoder.json", folder / "gpt2-vocab.json")
    shutil.copy(shared_file("gpt2-bpe") / "vocab.bpe", folder / "gpt2-merges.txt")
    return folder


def hf_names(tmp_path):
    folder = tmp_path / "hf_names"
    folder.mkdir()
    shutil.copy(shared_file("gpt2-bpe") / "encoder.json", folder / "vocab.json")
    shutil.copy(shared_file("gpt2-bpe") / "vocab.bpe", folder / "merges.txt")
    return folder


FORMS = {
    "openai-bpe-folder": lambda tmp, trained: shared_file("gpt2-bpe"),
    "megatron-folder": lambda tmp, trained: megatron_names(tmp),
    "megatron-vocab-file": lambda tmp, trained: megatron_names(tmp) / "gpt2-vocab.json",
    "megatron-merges-file": lambda tmp, trained: megatron_names(tmp) / "gpt2-merges.txt",
    "hf-bpe-files": lambda tmp, trained: hf_names(tmp),
    "tokenizer-json-file": lambda tmp, trained: shared_file("gpt-neox-20b-tokenizer") / "20B_tokenizer.json",
    "trained-bpe": lambda tmp, trained: trained / "bpe" / "tokenizer.json",
    "wordpiece-vocab-txt": lambda tmp, trained: trained / "wp" / "vocab.txt",
    "char-vocab-folder": lambda tmp, trained: trained / "char",
    "t5-spiece": lambda tmp, trained: shared_file("t5-spiece") / "spiece.model",
    "byte-fallback-sentencepiece": lambda tmp, trained: trained / "sp" / "sp.model",
}


@pytest.mark.parametrize("form", sorted(FORMS))
def test_to_hf_exports_every_form_transformers_loads_and_encodes_alike(form, checkpoint, trained, tmp_path,
                                                                        monkeypatch, builtin_texts):
    given = FORMS[form](tmp_path, trained)
    ours = load_tokenizer(given)
    monkeypatch.chdir(tmp_path)  # the user's own directory, relative paths
    cli.main(["to-hf", checkpoint, "out", f"--tokenizer={Path(given)}"])
    reference = transformers.AutoTokenizer.from_pretrained("out")
    for text in (TEXT, *CHINESE[:2], builtin_texts[200][:2000]):
        assert reference.encode(text, add_special_tokens=False) == ours.encode(text), (form, text[:60])
    assert load_tokenizer(tmp_path / "out").sha256 == ours.sha256


def test_to_hf_writes_the_recorded_tokenizer_after_its_files_are_gone(tmp_path):
    """A checkpoint made with Megatron's GPT-2 file names: to-hf, with the files deleted, writes a folder
    transformers loads (once a traceback and a half-written folder, or the vocab map saved as tokenizer.json)."""
    folder = megatron_names(tmp_path)
    ours = load_tokenizer(folder / "gpt2-vocab.json")
    config = GPT2Config(vocab_size=50257, max_len=16, num_layers=1, num_heads=2, embed_dim=8, mlp_dim=16)
    params = nn.meta.unbox(jax.jit(models.build_model(config).init)(jax.random.PRNGKey(0),
                                                                     jnp.zeros((1, 4), jnp.int32))["params"])
    store.save_params(str(tmp_path / "run"), 3, params,
                            {"config": dataclasses.asdict(config), "tokenizer": tokenizer_record(ours)})
    shutil.rmtree(folder)
    cli.main(["to-hf", str(tmp_path / "run"), str(tmp_path / "hf")])
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert reference.encode(TEXT, add_special_tokens=False) == ours.encode(TEXT)
    assert transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").config.eos_token_id == 50256


def test_a_cpm_folder_exports_as_cpm_tokenizer(checkpoint, trained, tmp_path):
    """CPM: the folder loads back as the same tokenizer, and transformers reads it as a CpmTokenizer (its
    encoding is not compared: transformers 5's CpmTokenizer drops the word-boundary pieces CPM-Generate's
    encode keeps, and maps byte-fallback pieces to <0x..> text)."""
    pytest.importorskip("rjieba", reason="transformers' CpmTokenizer needs rjieba (the test extra installs it)")
    ours = load_tokenizer(trained / "cpm")
    cli.main(["to-hf", checkpoint, str(tmp_path / "out"), f"--tokenizer=cpm:{trained / 'cpm'}"])
    assert type(transformers.AutoTokenizer.from_pretrained(tmp_path / "out")).__name__ == "CpmTokenizer"
    exported = load_tokenizer(tmp_path / "out")
    assert exported.sha256 == ours.sha256 and exported.encode_batch(CHINESE[:2]) == ours.encode_batch(CHINESE[:2])


def test_t5_sentinels_are_added_tokens_of_a_byte_fallback_tokenizer(trained, tmp_path):
    """T5's sentinels sit above the tokenizer's ids (<extra_id_0> the highest): T5Tokenizer's extra_ids for
    T5's own sentencepiece model, added tokens at those ids for the byte-fallback model T5Tokenizer cannot read."""
    from models.t5 import T5Config

    ours = load_tokenizer(trained / "sp" / "sp.model")
    config = T5Config(vocab_size=ours.vocab_size + 100, num_layers=1, num_decoder_layers=1, num_heads=2,
                      embed_dim=8, mlp_dim=16, d_kv=4)
    params = nn.meta.unbox(jax.jit(models.build_model(config).init)(
        jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32))["params"])
    store.save_params(str(tmp_path / "t5"), 1, params,
                            {"config": dataclasses.asdict(config), "tokenizer": tokenizer_record(ours)})
    hf.to_hf(str(tmp_path / "t5"), str(tmp_path / "hf"))
    reference = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert reference.convert_tokens_to_ids(["<extra_id_0>", "<extra_id_99>"]) == [ours.vocab_size + 99,
                                                                                   ours.vocab_size]
    text = "Hello <extra_id_0> world <extra_id_1>."
    assert reference.encode(text, add_special_tokens=False) == ours.encode(text)


def test_an_import_exports_its_own_special_tokens_and_adds_none(tmp_path):
    """Issue 52: a folder whose tokenizer_config.json names only an end-of-text and a padding token (no bos, no unk,
    transformers' unset model_max_length) and whose config.json has no bos_token_id: from-hf then to-hf gives back
    those entries as they were (once: bos_token / unk_token added, model_max_length the model's, bos_token_id 0)."""
    import json

    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(["a few words to learn a few merges from"] * 8, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>",
                                                pad_token="<|endoftext|>")
    transformers.set_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=len(fast), n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=None,
        eos_token_id=fast.eos_token_id)).save_pretrained(tmp_path / "orig")
    fast.save_pretrained(tmp_path / "orig")
    hf.from_hf(str(tmp_path / "orig"), str(tmp_path / "ours"))
    hf.to_hf(str(tmp_path / "ours"), str(tmp_path / "back"))
    original, exported = (json.loads((tmp_path / f / "tokenizer_config.json").read_text()) for f in ("orig", "back"))
    kept = ("bos_token", "eos_token", "unk_token", "pad_token", "model_max_length")
    assert {k: exported.get(k) for k in kept} == {k: original.get(k) for k in kept}, exported
    assert "bos_token" not in exported and "unk_token" not in exported
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (None, fast.eos_token_id)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "back").bos_token is None
