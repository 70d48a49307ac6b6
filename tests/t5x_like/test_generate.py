"""t5x_like.generate: greedy decoding and 4-beam search equal transformers' generate token for token
(batched prompts of different lengths, on a data x tensor mesh), sampling is reproducible by seed, rows
stop at EOD, and the CLI writes the documented JSONL."""
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from partitioning import Partitioner, make_mesh
from t5x_like import generate
from t5x_like.inference import decoding, loading
from tests.support.shared_data import shared_file, shared_file_if_present

EOD = 50256
NEW = 10


@pytest.fixture(scope="module")
def converted(tmp_path_factory, random_hf_gpt2):
    """(our checkpoint dir, the HF torch model it came from)."""
    from t5x_like.convert import hf

    model = random_hf_gpt2(0.3)  # spread the logits: no near-ties for argmax
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(path / "hf")
    bpe = shared_file_if_present("gpt2-bpe")
    if bpe is not None:  # a HF directory with its tokenizer, which from-hf copies and records
        shutil.copyfile(bpe / "encoder.json", path / "hf" / "vocab.json")
        shutil.copyfile(bpe / "vocab.bpe", path / "hf" / "merges.txt")
    hf.from_hf(str(path / "hf"), str(path / "ours"), scan_layers=False)
    return path / "ours", model


@pytest.fixture(scope="module")
def loaded(converted):
    checkpoint, _ = converted
    config, _ = loading.read_config(str(checkpoint))
    partitioner = Partitioner(make_mesh(data=4, tensor=2), "fsdp_tensor")
    return config, loading.restore_sharded(str(checkpoint), config, partitioner), partitioner


PROMPTS = [[464, 1748, 286], list(range(1000, 1009)), [31, 7, 1999, 2, 50, 311, 4, 8000, 9, 10, 11, 12, 13, 1, 2, 3, 77]]


def generator(loaded, settings, eod_id=EOD):
    config, params, partitioner = loaded
    return decoding.Generator(config, params, partitioner, eod_id=eod_id, max_new_tokens=NEW, settings=settings,
                              batch_size=4)


@pytest.fixture(scope="module")
def greedy(loaded):
    return generator(loaded, decoding.Sampling(temperature=0.0)).generate(PROMPTS)


def test_greedy_equals_transformers_generate(converted, greedy):
    import torch

    _, model = converted
    for prompt, ours in zip(PROMPTS, greedy):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=NEW, eos_token_id=EOD, pad_token_id=EOD)
        theirs = decoding.cut_at(out[0, len(prompt):].numpy(), EOD)
        assert ours == theirs
    assert len(set(map(tuple, greedy))) == len(PROMPTS) and all(len(g) == NEW for g in greedy)


def test_rows_stop_at_end_of_document(loaded, greedy):
    stop = greedy[1][3]
    first = greedy[1].index(stop)
    got = generator(loaded, decoding.Sampling(temperature=0.0), eod_id=stop).generate(PROMPTS)
    assert got[1] == greedy[1][:first]
    for ours, full in zip(got, greedy):
        assert ours == decoding.cut_at(np.array(full), stop)


def test_sampling_is_reproducible_by_seed(loaded, greedy):
    sampler = generator(loaded, decoding.Sampling(temperature=1.0, top_k=50, top_p=0.95))
    first, again, other = sampler.generate(PROMPTS, seed=1), sampler.generate(PROMPTS, seed=1), \
        sampler.generate(PROMPTS, seed=2)
    assert first == again
    assert first != other
    assert first != greedy


@pytest.mark.integration
def test_top_p_sampling_on_the_mesh_draws_what_one_device_draws(converted, loaded):
    """Top-p alone sorts and sums the whole vocabulary, which the data x tensor mesh splits over devices (a
    running sum over the split never finished when compiled at XLA's cheapest level, the suite's)."""
    checkpoint, _ = converted
    config, _ = loading.read_config(str(checkpoint))
    one = Partitioner(make_mesh(data=1, devices=jax.devices()[:1]), "fsdp_tensor")
    single = (config, loading.restore_sharded(str(checkpoint), config, one), one)
    settings = decoding.Sampling(temperature=1.0, top_p=0.9)
    drawn = generator(loaded, settings).generate(PROMPTS, seed=3)
    assert drawn == generator(single, settings).generate(PROMPTS, seed=3)
    assert drawn != generator(loaded, settings).generate(PROMPTS, seed=4)


def test_top_k_1_and_tiny_top_p_are_greedy():
    logits = jnp.array([[0.1, 2.0, 1.0, -1.0], [3.0, 0.0, 2.9, 1.0]])
    for settings in (decoding.Sampling(1.0, top_k=1), decoding.Sampling(1.0, top_p=1e-6)):
        samples = jax.vmap(lambda k: decoding.sample(logits, k, settings))(jax.random.split(jax.random.PRNGKey(0), 64))
        assert (samples == jnp.array([1, 0])).all()


def test_top_p_keeps_the_smallest_set_with_that_mass():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    settings = decoding.Sampling(1.0, top_p=0.7)
    samples = jax.vmap(lambda k: decoding.sample(logits, k, settings))(jax.random.split(jax.random.PRNGKey(0), 400))
    assert set(np.asarray(samples).ravel().tolist()) == {0, 1}


def test_cli_writes_jsonl(converted, tmp_path):
    bpe = shared_file("gpt2-bpe")  # the converted checkpoint records it only when it is there
    checkpoint, _ = converted
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "The city of"}) + "\n")
    out = tmp_path / "out.jsonl"
    records = generate.main([f"--checkpoint={checkpoint}", "--prompt=hangzhou is a beautiful city",
                             f"--prompts_file={prompts}", "--max_new_tokens=6", "--temperature=0",
                             f"--output={out}"])
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == records
    assert [r["prompt"] for r in written] == ["hangzhou is a beautiful city", "The city of"]
    from t5x_like.data import load_tokenizer

    tokenizer = load_tokenizer(bpe)
    for record in written:
        assert record["completion"] == tokenizer.decode(record["tokens"])
        assert record["finish_reason"] == ("length" if len(record["tokens"]) == 6 else "eod")


def test_bad_requests_are_refused(loaded, tmp_path, capsys):
    config, params, partitioner = loaded
    with pytest.raises(ValueError, match="--max_new_tokens=40 must be between 1 and the model's max_len - 1"):
        decoding.Generator(config, params, partitioner, eod_id=EOD, max_new_tokens=40,
                           settings=decoding.Sampling())
    with pytest.raises(ValueError, match="need temperature >= 0"):
        decoding.Sampling(temperature=-1.0)
    with pytest.raises(SystemExit):  # main is wrapped by exit_on_user_error: one line, exit 1
        generate.main([f"--checkpoint={tmp_path}"])
    assert "error: no prompts" in capsys.readouterr().err


def test_beam_search_equals_transformers(converted, loaded):
    """4 beams over left-padded prompts of different lengths: transformers' beam search per prompt."""
    import torch

    _, model = converted
    config, params, partitioner = loaded
    eos = generator(loaded, decoding.Sampling(temperature=0.0)).generate(PROMPTS)[0][2]  # some beams end early
    ours = decoding.Generator(config, params, partitioner, eod_id=eos, max_new_tokens=NEW, batch_size=4,
                              settings=decoding.Sampling(temperature=0.0), num_beams=4,
                              length_penalty=0.6).generate(PROMPTS)
    for prompt, got in zip(PROMPTS, ours):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, num_beams=4, early_stopping=False, length_penalty=0.6,
                                 max_new_tokens=NEW, eos_token_id=eos, pad_token_id=eos)
        assert got == decoding.cut_at(out[0, len(prompt):].numpy(), eos)


def test_repetition_penalty_equals_transformers_generate(converted, loaded):
    """Greedy decoding under a repetition penalty of 1.5 (prompt ids and generated ones penalised):
    transformers' generate(repetition_penalty=1.5) per prompt, token for token."""
    import torch

    _, model = converted
    ours = generator(loaded, decoding.Sampling(temperature=0.0, repetition_penalty=1.5)).generate(PROMPTS)
    for prompt, got in zip(PROMPTS, ours):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, repetition_penalty=1.5, max_new_tokens=NEW, eos_token_id=EOD,
                                 pad_token_id=EOD)
        assert got == decoding.cut_at(out[0, len(prompt):].numpy(), EOD)
    assert ours != generator(loaded, decoding.Sampling(temperature=0.0)).generate(PROMPTS)


def test_several_samples_per_prompt_differ_and_follow_their_prompt(loaded):
    sampler = generator(loaded, decoding.Sampling(temperature=1.0, top_k=50))
    samples = sampler.generate(PROMPTS[:2], seed=3, num_samples=3)
    assert len(samples) == 6 and len({tuple(s) for s in samples[:3]}) == 3
    assert samples[3:] != samples[:3]
