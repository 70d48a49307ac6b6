"""t5x_like.generate for an encoder-decoder checkpoint: a tiny random T5 v1.1 from transformers,
converted with `t5x_like.convert` and restored on a data 2 x fsdp 2 x tensor 2 mesh; batched
prompts of different lengths (the encoder inputs, EOS appended) decode to transformers' generate token for token,
greedy and with 4 beams (length penalties 1.0 and 0.6), rows stopping at EOS."""
import pytest

from partitioning import Partitioner, make_mesh
from t5x_like import generate
from t5x_like.inference import decoding, loading

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

# every sharded dimension divides by 2: heads 4, d_kv 8, width 32, mlp 48, vocab 200 padded to 256
HF_SIZES = dict(vocab_size=200, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
                relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                feed_forward_proj="gated-gelu", tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0)
NEW = 12
PROMPTS = [[5, 17, 88, 3], list(range(100, 121)), [9, 150, 2, 33, 71, 64, 12]]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(the restored checkpoint: config, params, partitioner; the HF model it came from)."""
    from t5x_like.convert import hf

    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**HF_SIZES))
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.eval()
    path = tmp_path_factory.mktemp("t5")
    model.save_pretrained(path / "hf")
    checkpoint = hf.from_hf(str(path / "hf"), str(path / "ours"))
    config, _ = loading.read_config(checkpoint)
    partitioner = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor")
    return (config, loading.restore_sharded(checkpoint, config, partitioner), partitioner), model


def ours(loaded, eos_id, **beams):
    config, params, partitioner = loaded
    return decoding.Generator(config, params, partitioner, eod_id=eos_id, max_new_tokens=NEW, batch_size=4,
                              settings=decoding.Sampling(temperature=0.0), **beams).generate(PROMPTS)


def theirs(model, eos_id, **beams):
    """transformers' generate, one prompt at a time with EOS appended (as training and transformers' T5
    tokenizer build encoder inputs), cut before EOS like ours."""
    out = []
    for prompt in PROMPTS:
        with torch.no_grad():
            ids = model.generate(input_ids=torch.tensor([prompt + [eos_id]]), max_new_tokens=NEW, do_sample=False,
                                 eos_token_id=eos_id, early_stopping=False, use_cache=False, **beams)
        out.append(decoding.cut_at(ids[0, 1:].numpy(), eos_id))
    return out


@pytest.fixture(scope="module")
def eos_id(converted):
    """A token the model emits early in the first prompt's greedy output (that token appended as EOS):
    some rows end early."""
    _, model = converted
    for candidate in range(1, HF_SIZES["vocab_size"]):
        with torch.no_grad():
            ids = model.generate(input_ids=torch.tensor([PROMPTS[0] + [candidate]]), max_new_tokens=NEW,
                                 do_sample=False, eos_token_id=None)
        if candidate in ids[0, 1:NEW - 2].tolist():
            return candidate
    raise AssertionError("no token ends the first prompt's output early")


def test_greedy_equals_transformers(converted, eos_id):
    loaded, model = converted
    got, want = ours(loaded, eos_id), theirs(model, eos_id, num_beams=1)
    assert got == want
    assert any(len(row) < NEW for row in got) and any(len(row) == NEW for row in got)


@pytest.mark.parametrize("length_penalty", [1.0, 0.6])
def test_beam_search_equals_transformers(converted, eos_id, length_penalty):
    loaded, model = converted
    got = ours(loaded, eos_id, num_beams=4, length_penalty=length_penalty)
    assert got == theirs(model, eos_id, num_beams=4, length_penalty=length_penalty)
    assert got != ours(loaded, eos_id)  # the search found something greedy decoding did not


def test_sampling_flags_with_beams_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        generate.main(["--checkpoint", str(tmp_path), "--prompt", "x", "--num_beams", "4", "--top_k", "5"])
    assert exit_.value.code == 1 and "--num_beams=4 searches deterministically" in capsys.readouterr().err
