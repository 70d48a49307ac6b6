"""Llama-class decoders <-> Hugging Face: for each variant (Llama with grouped KV heads, Llama 3.1's scaled
rotary, Qwen2's query/key/value biases and tied head, Mistral's sliding window), a tiny random transformers
model saved to a folder converts (from-hf) to logits equal to transformers', back (to-hf) to the same tensors,
and greedy decoding on a data x tensor mesh equals transformers' generate over 32 new tokens (Mistral's prompt
longer than its window); the presets' parameter counts equal transformers' for the same configs.

Tolerances: logits in fp32 within 1e-4 (magnitude ~10); the round trip is exact."""
import json

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

import configs  # noqa: E402
import models  # noqa: E402
from partitioning import Partitioner, make_mesh  # noqa: E402
from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.convert import hf, llama  # noqa: E402
from t5x_like.errors import UserError  # noqa: E402
from t5x_like.inference import decoding, loading  # noqa: E402
from tests.support.hf_models import VARIANTS, VOCAB, bos_tokenizer, random_model  # noqa: E402
from tests.support.shared_data import needs_shared  # noqa: E402

LOGITS_ATOL = 1e-4
EXPECTED = {"llama": {}, "llama3.1": dict(rope_scaling_factor=8.0, rope_original_max_len=32),
            "qwen2": dict(qkv_bias=True, tie_word_embeddings=True), "mistral": dict(sliding_window=8)}


@pytest.fixture(scope="module", params=list(VARIANTS))
def converted(request, tmp_path_factory):
    """(variant, the HF folder, the HF model, our checkpoint converted from the folder)."""
    path = tmp_path_factory.mktemp(request.param)
    model = random_model(request.param)
    model.save_pretrained(path / "hf")
    cli.main(["from-hf", str(path / "hf"), str(path / "ours"), "--no_scan_layers"])
    return request.param, path / "hf", model, path / "ours"


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def test_from_hf_gives_transformers_logits(converted):
    variant, _, model, ours = converted
    config, _ = loading.read_config(str(ours))
    expected = {k: getattr(config, k) for k in EXPECTED[variant]}
    assert (config.family, config.num_kv_heads, expected) == ("llama", 2, EXPECTED[variant])
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 40))  # longer than Mistral's window
    params = hf.restore_on_host(str(ours), config)
    logits = jax.jit(lambda p, t: models.build_model(config).apply({"params": p}, t))(params, tokens)
    np.testing.assert_allclose(np.asarray(logits)[..., :VOCAB], hf_logits(model, tokens), atol=LOGITS_ATOL, rtol=0)


def test_to_hf_gives_back_the_same_tensors(converted, tmp_path):
    from safetensors.numpy import load_file

    variant, src, model, ours = converted
    cli.main(["to-hf", str(ours), str(tmp_path / "back")])
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    theirs = {name: t.numpy() for name, t in model.state_dict().items()
              if not (model.config.tie_word_embeddings and name == "lm_head.weight")}
    assert set(back) == set(theirs)
    for name, tensor in theirs.items():
        np.testing.assert_array_equal(back[name], tensor, err_msg=name)
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["model_type"] == {"llama3.1": "llama"}.get(variant, variant)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    tokens = np.random.default_rng(1).integers(0, VOCAB, (1, 24))
    np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(model, tokens), atol=1e-5, rtol=0)


def test_greedy_decoding_on_a_mesh_equals_transformers_generate(converted):
    variant, _, model, ours = converted
    config, _ = loading.read_config(str(ours))
    partitioner = Partitioner(make_mesh(data=2, tensor=2, devices=jax.devices()[:4]), "fsdp_tensor")
    params = loading.restore_sharded(str(ours), config, partitioner)
    eod, new = VOCAB - 1, 32
    prompts = [[464 % VOCAB, 748, 286], list(range(100, 112)), [31, 7, 999 - 1, 2, 50, 311, 4, 800, 9, 10, 11]]
    ours_out = decoding.Generator(config, params, partitioner, eod_id=eod, max_new_tokens=new,
                                  settings=decoding.Sampling(temperature=0.0), batch_size=4).generate(prompts)
    for prompt, row in zip(prompts, ours_out):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=new, eos_token_id=eod, pad_token_id=eod)
        assert row == decoding.cut_at(out[0, len(prompt):].numpy(), eod), variant
    assert len(set(map(tuple, ours_out))) == len(prompts)


@needs_shared("gpt-neox-20b-tokenizer", "20B_tokenizer.json")
def test_a_folder_with_sharded_weights_and_its_tokenizer_generates_what_transformers_does(tmp_path, monkeypatch):
    """As a user runs it, from a working directory of their own: a folder as transformers saves it (weights in
    shards with their index, the tokenizer's files), from-hf, then `generate` with a text prompt: the prompt is
    encoded as the folder's tokenizer encodes it (its BOS first) and the 32 greedy tokens are transformers'."""
    from t5x_like import generate as generate_cli

    monkeypatch.chdir(tmp_path)
    tokenizer = bos_tokenizer("Llama-tiny")
    model = random_model("llama3.1", seed=3, vocab_size=len(tokenizer))
    model.save_pretrained("Llama-tiny", max_shard_size="2MB")
    assert len(json.loads((tmp_path / "Llama-tiny" / "model.safetensors.index.json").read_text())["weight_map"]) > 1
    cli.main(["from-hf", "Llama-tiny", "runs/llama-tiny"])
    prompt, new, eod = "The capital of France is", 32, tokenizer.eos_token_id
    records = generate_cli.main(["--checkpoint=runs/llama-tiny", f"--prompt={prompt}", f"--max_new_tokens={new}",
                                 "--temperature=0"])
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    assert ids[0, 0] == tokenizer.bos_token_id
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                             eos_token_id=eod, pad_token_id=eod)
    assert records[0]["tokens"] == decoding.cut_at(out[0, ids.shape[1]:].numpy(), eod)
    assert records[0]["completion"] == tokenizer.decode(records[0]["tokens"])


PRESET_CLASSES = {"qwen2": transformers.Qwen2Config, "mistral": transformers.MistralConfig}


@pytest.mark.parametrize("preset", [p for p in configs.PRESETS if models.config_from_dict(
    configs.get_model_config(p).to_dict()).family == "llama"])
def test_preset_parameter_counts_equal_transformers(preset):
    """Counted on torch's meta device (no memory); ours from the parameter shapes, vocabulary unpadded."""
    config = models.config_from_dict({**configs.get_model_config(preset).to_dict(), "vocab_pad_multiple": 1})
    hf_config = llama.config_to_hf(config, eod_id=None)
    config_class = PRESET_CLASSES.get(hf_config["model_type"], transformers.LlamaConfig)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config_class(**hf_config))
    theirs = sum(p.numel() for p in model.parameters())
    shapes = jax.eval_shape(lambda: models.build_model(config).init(jax.random.key(0), np.zeros((1, 8), np.int32)))
    ours = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes["params"]))
    assert ours == theirs, preset


def test_unsupported_hf_options_are_named(tmp_path):
    model = random_model("llama")
    model.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "mlp_bias": True}))
    with pytest.raises(UserError, match=r"config.json: mlp_bias=True is not supported by our llama"):
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))


def llama_2_tokenizer(folder, corpus_dir):
    """A Llama 2-style tokenizer (a byte-fallback BPE sentencepiece model with Llama's `<unk>`, `<s>`, `</s>` at
    ids 0, 1, 2), trained on Python's help topics and loaded and saved as transformers does a Llama 2 folder's."""
    import pydoc_data.topics

    import sentencepiece

    corpus = corpus_dir / "corpus.txt"
    corpus.write_text("\n".join(list(pydoc_data.topics.topics.values())[:80]))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(corpus_dir / "tokenizer"), vocab_size=VOCAB, model_type="bpe",
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True, character_coverage=1.0, minloglevel=2)
    tokenizer = transformers.LlamaTokenizer.from_pretrained(corpus_dir)
    tokenizer.save_pretrained(folder)
    return tokenizer


def test_an_imported_llama_2_folder_exports_with_its_special_tokens(tmp_path):
    """from-hf then to-hf of a Llama 2-style folder: the export's tokenizer has the same class, special tokens and
    encodings, and config.json the same bos / eos ids (they became `</s>` and 2 before)."""
    original = llama_2_tokenizer(tmp_path / "hf", tmp_path)
    random_model("llama", vocab_size=len(original), bos_token_id=1, eos_token_id=2).save_pretrained(tmp_path / "hf")
    cli.main(["from-hf", str(tmp_path / "hf"), str(tmp_path / "ours")])
    cli.main(["to-hf", str(tmp_path / "ours"), str(tmp_path / "back")])
    exported = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
    specials = lambda t: (type(t).__name__, t.bos_token, t.eos_token, t.unk_token, t.all_special_ids)  # noqa: E731
    assert specials(exported) == specials(original) == ("LlamaTokenizer", "<s>", "</s>", "<unk>", [1, 2, 0])
    text = "Hello world: the <s> quick\n brown fox </s> ünïcödé 0123"
    assert exported(text).input_ids == original(text).input_ids
    configs_json = [json.loads((tmp_path / d / "config.json").read_text()) for d in ("hf", "back")]
    assert [(c["bos_token_id"], c["eos_token_id"]) for c in configs_json] == [(1, 2), (1, 2)]
