"""load_model (t5x_like/inference/model.py), a checkpoint from Python, against transformers: a tiny random GPT-2
with GPT-2's tokenizer, a tiny random T5 v1.1 with T5's sentencepiece and a BERT masked LM, converted with from-hf
and loaded by relative path from a working directory of the test's own. Logits equal transformers' (fp32, atol
1e-4), log-probabilities equal its log-softmax, greedy generation of text prompts equals transformers'
generate(do_sample=False) token for token and the generate command's records; the python blocks of
docs/generation.md and docs/conversion.md run as written; mistakes are one UserError naming the value."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like import generate, load_model  # noqa: E402
from t5x_like.convert import __main__ as convert  # noqa: E402
from t5x_like.errors import UserError  # noqa: E402
from tests.docs.doc_commands import python_blocks  # noqa: E402
from tests.support import hf_models  # noqa: E402
from tests.support.environment import cpu_env  # noqa: E402
from tests.support.shared_data import needs_shared, shared_file  # noqa: E402

LOGITS_ATOL = 1e-4  # fp32, logits of magnitude ~10
NEW = 8
GPT2_TEXTS = ["hangzhou is a beautiful city", "the history of the roman empire began"]
T5_TEXTS = ["translate English to German: The house is wonderful.", "summarize: a tiny model"]
T5_REAL_IDS = 32100  # spiece's 32000 pieces and 100 sentinels; transformers' T5 has 32128 rows


def converted(root, folder: str, run: str) -> None:
    """from-hf FOLDER RUN, from `root` with relative paths, as a user runs it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        convert.main(["from-hf", folder, run])


@pytest.fixture(scope="module")
def gpt2_root(tmp_path_factory, random_hf_gpt2):
    """A folder holding gpt2/ (a tiny GPT-2 as transformers saves it, GPT-2's tokenizer files beside it) and
    runs/gpt2-hf, its import; runs/gpt2 names the same run (docs/generation.md's name)."""
    root = tmp_path_factory.mktemp("gpt2_api")
    model = random_hf_gpt2(0.2)
    model.save_pretrained(root / "gpt2")
    bpe = shared_file("gpt2-bpe")
    shutil.copy(bpe / "encoder.json", root / "gpt2" / "vocab.json")
    shutil.copy(bpe / "vocab.bpe", root / "gpt2" / "merges.txt")
    tokenizer = transformers.AutoTokenizer.from_pretrained(root / "gpt2")
    tokenizer.save_pretrained(root / "gpt2")
    converted(root, "gpt2", "runs/gpt2-hf")
    os.symlink("gpt2-hf", root / "runs" / "gpt2")
    return root, model, tokenizer


@pytest.fixture(scope="module")
def gpt2(gpt2_root):
    root = gpt2_root[0]
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        return load_model("runs/gpt2-hf", tensor_parallel=2)


def hf_greedy(model, ids: list[int], eos: int, **kwargs) -> list[int]:
    """transformers' greedy ids after the prompt (a decoder's; an encoder-decoder's start id dropped), cut at eos."""
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             do_sample=False, max_new_tokens=NEW, eos_token_id=eos, **kwargs)[0].tolist()
    out = out[1:] if model.config.is_encoder_decoder else out[len(ids):]
    return out[:out.index(eos)] if eos in out else out


@needs_shared("gpt2-bpe")
def test_gpt2_logits_and_log_probs_equal_transformers(gpt2_root, gpt2):
    _, model, tokenizer = gpt2_root
    ids = np.array([tokenizer(text).input_ids[:6] for text in GPT2_TEXTS])
    with torch.no_grad():
        want = model(torch.tensor(ids)).logits
    got = gpt2.logits(ids)
    assert got.shape == (2, 6, 50257) == tuple(want.shape) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.numpy(), atol=LOGITS_ATOL, rtol=0)
    want_log_probs = torch.log_softmax(want[:, :-1], -1).gather(-1, torch.tensor(ids[:, 1:, None]))[..., 0]
    np.testing.assert_allclose(gpt2.log_probs(ids), want_log_probs.numpy(), atol=LOGITS_ATOL, rtol=0)


@needs_shared("gpt2-bpe")
def test_gpt2_greedy_generation_equals_transformers_and_the_generate_command(gpt2_root, gpt2, monkeypatch):
    root, model, tokenizer = gpt2_root
    records = gpt2.generate(GPT2_TEXTS, max_new_tokens=NEW, temperature=0)
    for text, record in zip(GPT2_TEXTS, records):
        prompt = tokenizer(text).input_ids
        assert (record["prompt"], record["prompt_tokens"]) == (text, prompt)
        assert record["tokens"] == hf_greedy(model, prompt, tokenizer.eos_token_id) and len(record["tokens"]) == NEW
        assert record["completion"] == tokenizer.decode(record["tokens"])
    assert gpt2.generate([records[1]["prompt_tokens"]], max_new_tokens=NEW, temperature=0)[0]["tokens"] == \
        records[1]["tokens"]
    monkeypatch.chdir(root)
    assert generate.main(["--checkpoint=runs/gpt2-hf", *(f"--prompt={t}" for t in GPT2_TEXTS),
                          f"--max_new_tokens={NEW}", "--temperature=0"]) == records


@pytest.fixture(scope="module")
def t5_root(tmp_path_factory):
    """A T5 v1.1 folder (transformers' 32128 rows, spiece.model beside it) and its import, runs/t5. The 28 rows
    past the tokenizer's ids are zero in transformers' head, so its greedy choice is among the real ids."""
    root = tmp_path_factory.mktemp("t5_api")
    sizes = dict(hf_models.HF_SIZES, vocab_size=32128, num_decoder_layers=2)  # its generate: as many as num_layers
    model = hf_models.random_hf_model("v1.1", seed=2, sizes=sizes)
    with torch.no_grad():
        model.lm_head.weight[T5_REAL_IDS:] = 0.0
    model.save_pretrained(root / "t5")
    shutil.copy(shared_file("t5-spiece", "spiece.model"), root / "t5" / "spiece.model")
    converted(root, "t5", "runs/t5")
    return root, model


@needs_shared("t5-spiece", "spiece.model")
def test_t5_logits_log_probs_and_greedy_generation_equal_transformers(t5_root, monkeypatch):
    root, model = t5_root
    monkeypatch.chdir(root)
    t5 = load_model("runs/t5")
    assert (t5.kind, t5.vocab_size, t5.eod_id) == ("encoder_decoder", T5_REAL_IDS, 1)
    inputs = np.array([t5.encode(text)[:5] + [t5.eod_id] for text in T5_TEXTS])
    decoder = np.array([[0, 5, 17, 88, 3], [0, 30, 31, 32, 33]])
    with torch.no_grad():
        want = model(input_ids=torch.tensor(inputs), decoder_input_ids=torch.tensor(decoder)).logits
    np.testing.assert_allclose(t5.logits(inputs, decoder), want[..., :T5_REAL_IDS].numpy(), atol=LOGITS_ATOL, rtol=0)
    real = torch.log_softmax(want[:, :-1, :T5_REAL_IDS], -1)
    want_log_probs = real.gather(-1, torch.tensor(decoder[:, 1:, None]))[..., 0].numpy()
    np.testing.assert_allclose(t5.log_probs(inputs, decoder), want_log_probs, atol=LOGITS_ATOL, rtol=0)

    records = t5.generate(T5_TEXTS, max_new_tokens=NEW, temperature=0)
    for text, record in zip(T5_TEXTS, records):
        want_ids = hf_greedy(model, t5.encode(text) + [t5.eod_id], t5.eod_id, decoder_start_token_id=0,
                             pad_token_id=0)
        assert record["tokens"] == want_ids and record["completion"] == t5.decode(want_ids)
    assert generate.main(["--checkpoint=runs/t5", *(f"--prompt={t}" for t in T5_TEXTS), f"--max_new_tokens={NEW}",
                          "--temperature=0"]) == records


def test_bert_masked_lm_logits_equal_transformers_and_ids_need_no_tokenizer(tmp_path, monkeypatch):
    """A folder without vocab.txt: no tokenizer recorded; logits of ids work, text asks for tokenizer=."""
    config = transformers.BertConfig(vocab_size=300, hidden_size=36, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=52, max_position_embeddings=40)
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(tmp_path / "bert")
    converted(tmp_path, "bert", "runs/bert")
    monkeypatch.chdir(tmp_path)
    bert = load_model("runs/bert")
    ids = np.random.default_rng(0).integers(0, 300, (3, 11))
    with torch.no_grad():
        want = model(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(bert.logits(ids), want, atol=LOGITS_ATOL, rtol=0)
    with pytest.raises(UserError, match=r"checkpoint runs/bert records no tokenizer.*tokenizer=PATH"):
        bert.encode("hello")
    with pytest.raises(UserError, match="encoder-only model, which predicts masked tokens"):
        bert.log_probs(ids)
    with pytest.raises(UserError, match="ids has 41 tokens per row but the model takes at most 40"):
        bert.logits(np.zeros((1, 41), int))


@needs_shared("gpt2-bpe")
@pytest.mark.parametrize("call, message", [
    (lambda m: m.logits(np.array([[5, 50257]])), r"ids holds id 50257, outside the model's 50257-id vocabulary"),
    (lambda m: m.logits(np.array([[-1]])), "ids holds id -1"),
    (lambda m: m.logits(np.zeros((1, 41), int)), r"ids has 41 tokens per row but the model takes at most 40"),
    (lambda m: m.logits(np.array([1, 2])), r"ids: expected integer token ids \[batch, length\].*int64 values of "
                                           r"shape \(2,\)"),
    (lambda m: m.logits([[1, 2], [3]]), "rows of different lengths"),
    (lambda m: m.logits(np.array([[1.0]])), "float64 values"),
    (lambda m: m.logits(np.array([[1]]), np.array([[1]])), "decoder-only model takes ids alone"),
    (lambda m: m.log_probs(np.array([[1]])), "at least 2"),
    (lambda m: m.generate("hello"), r"prompts 'hello' is one text: give a list of prompts, e.g. \['hello'\]"),
    (lambda m: m.generate([1, 2]), r"prompts\[0\] is 1: each prompt is a text or a list of token ids"),
    (lambda m: m.generate(["hi", [3, 60000]]), r"prompts\[1\] holds id 60000"),
    (lambda m: m.generate(["hi"], top_k=-1), "--top_k=-1"),
    (lambda m: m.generate(["hi"], max_new_tokens=40), r"--max_new_tokens=40 must be between 1 and the model's "
                                                      r"max_len - 1 \(39\)"),
    (lambda m: m.generate(["hi"], num_beams=2, temperature=0.5), "--num_beams=2 searches deterministically"),
], ids=lambda value: "" if callable(value) else value[:40])
def test_a_mistake_is_one_user_error_naming_it(gpt2, call, message):
    with pytest.raises(UserError, match=message):
        call(gpt2)


@needs_shared("gpt2-bpe")
def test_a_path_that_is_no_checkpoint_a_damaged_one_and_bad_mesh_choices_are_named(gpt2_root, monkeypatch):
    root = gpt2_root[0]
    monkeypatch.chdir(root)
    with pytest.raises(UserError, match=r"no checkpoint at \S*gpt2_api\d*/gpt2: expected a MODEL_DIR"):
        load_model("gpt2")
    with pytest.raises(UserError, match="--tensor_parallel=3"):
        load_model("runs/gpt2-hf", tensor_parallel=3)
    with pytest.raises(UserError, match="--dtype='float8'"):
        load_model("runs/gpt2-hf", dtype="float8")
    with pytest.raises(UserError, match="--data_parallel='2'"):
        load_model("runs/gpt2-hf", data_parallel="2")
    shutil.copytree("runs/gpt2-hf", "damaged")
    files = [os.path.join(r, f) for r, _, fs in os.walk("damaged/checkpoints") for f in fs if "params" in r]
    largest = max(files, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(os.path.getsize(largest) - 16)
    with pytest.raises(UserError, match="damaged"):
        load_model("damaged")


@needs_shared("gpt2-bpe")
@pytest.mark.parametrize("page", ["docs/generation.md", "docs/conversion.md"])
def test_the_pages_python_blocks_run_as_written(gpt2_root, page, monkeypatch, capsys):
    """The pages' working directory holds gpt2/ and its import runs/gpt2-hf (runs/gpt2: the same run)."""
    monkeypatch.chdir(gpt2_root[0])
    [block] = python_blocks(page)
    namespace: dict = {}
    exec(compile(block, page, "exec"), namespace)  # conversion.md's block asserts transformers' logits itself
    if page == "docs/generation.md":
        assert namespace["logits"].shape == (*namespace["ids"].shape, 50257) and len(namespace["records"]) == 2
        assert namespace["records"][0]["completion"] in capsys.readouterr().out


@pytest.mark.system
def test_importing_the_package_imports_no_jax():
    """`from t5x_like import load_model` resolves on first use (the tests above): `import t5x_like` stays cheap."""
    code = "import sys, t5x_like; assert 'jax' not in sys.modules, sorted(sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cpu_env(1))
    assert done.returncode == 0, done.stderr
