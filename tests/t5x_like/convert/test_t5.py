"""T5 <-> Hugging Face / torch: HF -> ours -> HF is lossless for v1.0 (tied) and v1.1 (untied),
transformers loads what to-hf writes and gives the logits of the original (fp32, atol 1e-4),
to-torch gives a state_dict that loads strictly, and T5's sentencepiece tokenizer is carried both
ways with the vocabulary cut to its 32100 real ids (32128 rows on HF's side). Folders as transformers >= 5.2
writes them (tie_word_embeddings always true, the scaling in scale_decoder_outputs) and google's untied
v1.1 folders convert with transformers' logits and greedy ids."""
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.convert import hf  # noqa: E402
from t5x_like.inference import loading  # noqa: E402
from tests.support import hf_models  # noqa: E402
from tests.support.shared_data import SHARED_DATA, needs_shared, shared_file  # noqa: E402

SPIECE = SHARED_DATA / "t5-spiece" / "spiece.model"
HF_SIZES = dict(d_model=16, d_kv=5, d_ff=24, num_layers=2, num_decoder_layers=1, num_heads=2, dropout_rate=0.0,
                relative_attention_num_buckets=8, relative_attention_max_distance=16)
VERSIONS = {"v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
            "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}
LOGITS_ATOL = 1e-4


def random_hf_model(version: str, vocab_size: int, seed: int = 0):
    return hf_models.random_hf_model(version, seed, sizes=dict(HF_SIZES, vocab_size=vocab_size))


def logits(model, inputs, targets):
    with torch.no_grad():
        return model(input_ids=torch.tensor(inputs), decoder_input_ids=torch.tensor(targets)).logits.numpy()


def state(model) -> dict:
    return {n: p.detach().numpy() for n, p in model.state_dict().items()}


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_hf_ours_hf_is_lossless_and_transformers_loads_it(tmp_path, version):
    model = random_hf_model(version, vocab_size=128)
    model.save_pretrained(tmp_path / "hf")
    cli.main(["from-hf", str(tmp_path / "hf"), str(tmp_path / "ours")])
    config, tokenizer = loading.read_config(str(tmp_path / "ours"))
    assert (config.family, config.vocab_size, config.tie_word_embeddings, tokenizer) == (
        "t5", 128, version == "v1.0", None)
    cli.main(["to-hf", str(tmp_path / "ours"), str(tmp_path / "back")])
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    want, got = state(model), state(back)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    inputs, targets = np.random.default_rng(0).integers(1, 128, (2, 11)), np.arange(1, 15).reshape(2, 7)
    np.testing.assert_allclose(logits(back, inputs, targets), logits(model, inputs, targets), atol=LOGITS_ATOL,
                               rtol=0)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_to_torch_state_dict_loads_strictly(tmp_path, version):
    model = random_hf_model(version, vocab_size=128, seed=1)
    model.save_pretrained(tmp_path / "hf")
    hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"), scan_layers=False)
    cli.main(["to-torch", str(tmp_path / "ours"), str(tmp_path / "model.pt")])
    loaded = torch.load(tmp_path / "model.pt", weights_only=True)
    fresh = random_hf_model(version, vocab_size=128, seed=2)
    fresh.load_state_dict(loaded, strict=True)
    untied = not torch.equal(loaded["lm_head.weight"], loaded["shared.weight"])
    assert untied == (version == "v1.1")
    for name, want in state(model).items():
        np.testing.assert_array_equal(state(fresh)[name], want, err_msg=name)


needs_spiece = needs_shared("t5-spiece", "spiece.model")


@pytest.fixture(scope="module")
def spiece_round_trip(tmp_path_factory):
    """HF's 32128-row T5 v1.1 with spiece.model -> ours -> HF."""
    tmp_path = tmp_path_factory.mktemp("spiece")
    model = random_hf_model("v1.1", vocab_size=32128, seed=3)
    model.save_pretrained(tmp_path / "hf")
    (tmp_path / "hf" / "spiece.model").write_bytes(shared_file("t5-spiece", "spiece.model").read_bytes())
    hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    hf.to_hf(str(tmp_path / "ours"), str(tmp_path / "back"))
    return model, tmp_path


@needs_spiece
def test_spiece_tokenizer_and_the_32100_real_ids_go_both_ways(spiece_round_trip):
    """Ours: vocab_size 32100 (32000 pieces + 100 sentinels) padded to 32128, the tokenizer copied and
    recorded. HF again: 32128 rows, spiece.model byte for byte, a T5Tokenizer config with 100 extra ids."""
    model, tmp_path = spiece_round_trip
    config, tokenizer_path = loading.read_config(str(tmp_path / "ours"))
    assert (config.vocab_size, config.padded_vocab_size) == (32100, 32128)
    assert (Path(tokenizer_path) / "spiece.model").read_bytes() == SPIECE.read_bytes()
    assert loading.open_tokenizer(tokenizer_path, config).vocab_size == 32000
    hf_config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (hf_config["vocab_size"], hf_config["eos_token_id"], hf_config["tie_word_embeddings"]) == (32128, 1, False)
    assert (tmp_path / "back" / "spiece.model").read_bytes() == SPIECE.read_bytes()
    tokenizer_config = json.loads((tmp_path / "back" / "tokenizer_config.json").read_text())
    assert (tokenizer_config["tokenizer_class"], tokenizer_config["extra_ids"], tokenizer_config["eos_token"]) == (
        "T5Tokenizer", 100, "</s>")
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "back")
    for name in ("shared.weight", "lm_head.weight"):
        np.testing.assert_array_equal(back.get_parameter(name).detach().numpy()[:32100],
                                      model.get_parameter(name).detach().numpy()[:32100])


@needs_spiece
def test_transformers_reads_the_written_tokenizer(spiece_round_trip):
    """transformers parses spiece.model with sentencepiece's generated protobuf module, which needs a
    protobuf runtime at least as new as the one it was generated for (the test extra pins it)."""
    import sentencepiece

    tokenizer = transformers.AutoTokenizer.from_pretrained(spiece_round_trip[1] / "back")
    text = "translate English to German: The house is wonderful."
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(SPIECE)).encode(text)
    assert tokenizer(text).input_ids == pieces + [1]
    assert tokenizer.convert_tokens_to_ids("<extra_id_0>") == 32099


def test_unsupported_feed_forward_is_refused(tmp_path):
    model = random_hf_model("v1.0", vocab_size=64)
    model.config.feed_forward_proj = "gated-silu"
    model.save_pretrained(tmp_path / "hf")
    with pytest.raises(ValueError, match="feed_forward_proj='gated-silu'"):
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))


# ---- transformers >= 5.2 folders: tie_word_embeddings always true, the scaling in scale_decoder_outputs
GREEDY_STEPS = 10


def ours_logits(checkpoint: str, inputs, targets) -> np.ndarray:
    """Our model's logits over the real vocabulary, on one CPU device (fp32)."""
    from t5x_like.lm import make_lm

    config, _ = loading.read_config(checkpoint)
    params = hf.restore_on_host(checkpoint, config)
    out = make_lm(config).module.apply({"params": params}, np.asarray(inputs), np.asarray(targets))
    return np.asarray(out)[..., :config.vocab_size]


def greedy_pair(checkpoint: str, model, prompts) -> tuple[list, list]:
    """(ours, transformers') greedy ids of each prompt (EOS = 1 appended to the encoder input, cut at EOS)."""
    from partitioning import Partitioner, make_mesh
    from t5x_like.inference import decoding

    config, _ = loading.read_config(checkpoint)
    partitioner = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor")
    params = loading.restore_sharded(checkpoint, config, partitioner)
    got = decoding.Generator(config, params, partitioner, eod_id=1, max_new_tokens=GREEDY_STEPS, batch_size=4,
                             settings=decoding.Sampling(temperature=0.0)).generate(prompts)
    want = []
    for prompt in prompts:
        with torch.no_grad():
            ids = model.generate(input_ids=torch.tensor([prompt + [1]]), max_new_tokens=GREEDY_STEPS,
                                 do_sample=False, eos_token_id=1, decoder_start_token_id=0, pad_token_id=0)
        want.append(decoding.cut_at(ids[0, 1:].numpy(), 1))
    return got, want


def transformers5_folder(path: Path, seed: int):
    """A v1.1 configuration saved by the installed transformers as it builds it: tied, unscaled."""
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=128, **HF_SIZES, **VERSIONS["v1.1"]))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.eval().save_pretrained(path)
    from safetensors import safe_open

    written = json.loads((path / "config.json").read_text())
    with safe_open(path / "model.safetensors", "pt") as f:
        names = set(f.keys())
    if not (written.get("tie_word_embeddings") and written.get("scale_decoder_outputs") is False
            and "lm_head.weight" not in names):
        pytest.skip(f"transformers {transformers.__version__} does not write the >= 5.2 tied, unscaled layout")
    return model


PROMPTS = [[5, 17, 88, 3], list(range(30, 51)), [9, 120, 2, 33, 71, 64, 12]]


def test_transformers5_tied_unscaled_folder_converts(tmp_path):
    """from-hf: tied (no lm_head parameter), unscaled; logits (atol 1e-4) and greedy ids equal transformers';
    to-hf writes it as an untied head equal to shared.weight, which transformers loads with the same logits."""
    model = transformers5_folder(tmp_path / "hf", seed=4)
    checkpoint = hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    config, _ = loading.read_config(checkpoint)
    assert (config.tie_word_embeddings, config.scale_decoder_outputs) == (True, False)
    assert "lm_head" not in hf.restore_on_host(checkpoint, config)
    inputs, targets = np.random.default_rng(1).integers(1, 128, (2, 11)), np.arange(1, 15).reshape(2, 7)
    want = logits(model, inputs, targets)
    np.testing.assert_allclose(ours_logits(checkpoint, inputs, targets), want, atol=LOGITS_ATOL, rtol=0)
    scaled = want * HF_SIZES["d_model"] ** -0.5  # what reading the folder as v1.0 (tied = scaled) would give
    assert np.abs(scaled - want).max() > 100 * LOGITS_ATOL
    got, want_ids = greedy_pair(checkpoint, model, PROMPTS)
    assert got == want_ids and all(got)
    hf.to_hf(checkpoint, str(tmp_path / "back"))
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (written["tie_word_embeddings"], written["scale_decoder_outputs"]) == (False, False)
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "back").eval()
    np.testing.assert_allclose(logits(back, inputs, targets), logits(model, inputs, targets), atol=LOGITS_ATOL,
                               rtol=0)


@pytest.mark.parametrize("style", ["google", "transformers5-untied"])
def test_untied_v1_1_folders_keep_working(tmp_path, style):
    """google/t5-v1_1 folders (tie_word_embeddings: false, an lm_head.weight, no scale_decoder_outputs) and
    transformers 5 folders of a model untied in memory (tie_word_embeddings: true, scale_decoder_outputs:
    false, an lm_head.weight unlike shared.weight) convert untied and unscaled, logits and greedy ids
    equal transformers'."""
    model = random_hf_model("v1.1", vocab_size=128, seed=5)
    model.save_pretrained(tmp_path / "hf")
    if style == "google":
        written = json.loads((tmp_path / "hf" / "config.json").read_text())
        written["tie_word_embeddings"] = False
        written.pop("scale_decoder_outputs", None)
        (tmp_path / "hf" / "config.json").write_text(json.dumps(written))
    checkpoint = hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    config, _ = loading.read_config(checkpoint)
    assert (config.tie_word_embeddings, config.scale_decoder_outputs) == (False, False)
    reloaded = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "hf").eval()
    inputs, targets = np.random.default_rng(2).integers(1, 128, (2, 9)), np.arange(1, 11).reshape(2, 5)
    want = logits(model, inputs, targets)
    np.testing.assert_allclose(logits(reloaded, inputs, targets), want, atol=LOGITS_ATOL, rtol=0)
    np.testing.assert_allclose(ours_logits(checkpoint, inputs, targets), want, atol=LOGITS_ATOL, rtol=0)
    got, want_ids = greedy_pair(checkpoint, model, PROMPTS)
    assert got == want_ids
