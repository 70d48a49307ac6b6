"""eval --task=seq2seq on a tiny random T5 v1.1 from transformers (converted, builtin tokenizer, a data 4
x tensor 2 mesh): loss and token accuracy equal transformers' on the same pairs (fp32, rtol 1e-5), exact
match counts the pairs whose target text is transformers' greedy output; bad lines name file:line."""
import json

import numpy as np
import pytest

from t5x_like.data import SourceSettings, load_tokenizer, make_source
from t5x_like.eval import cli as evaluation
from t5x_like.eval import seq2seq
from t5x_like.inference import decoding

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

INPUTS = ["translate: the cat sat on the mat", "summarize: functions return values", "question: what is two",
          "the quick brown fox jumps over the lazy dog"]
LONG_TARGET = " ".join(["words that make a long target"] * 10)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(checkpoint, tokenizer path, HF model, pairs file, the pairs)."""
    from t5x_like.convert import hf

    path = tmp_path_factory.mktemp("t5eval")
    tokenizer = make_source("train", SourceSettings(objective="span_corruption"), batch_size=8,
                            feature_lengths={"inputs": 32, "targets": 8}, seed=0, shard_index=0,
                            shard_count=1).tokenizer_path
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=8292, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0))
    model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.eval()
    tok = load_tokenizer(tokenizer)
    prompt = torch.tensor([tok.encode(INPUTS[0]) + [tok.eod_id]])

    def greedy(steps, eos_id):
        with torch.no_grad():
            out = model.generate(input_ids=prompt, max_new_tokens=steps, do_sample=False, eos_token_id=eos_id,
                                 decoder_start_token_id=0, pad_token_id=0)
        return decoding.cut_at(out[0, 1:].numpy(), tok.eod_id) if eos_id is not None else out[0, 1:].tolist()

    liked = greedy(6, None)[5]
    with torch.no_grad():  # EOS (id 0) outbids a token the model likes: the first pair's output ends early
        model.lm_head.weight[tok.eod_id] = model.lm_head.weight[liked] * 1.05
    model.save_pretrained(path / "hf")
    checkpoint = hf.from_hf(str(path / "hf"), str(path / "ours"))
    steps = len(tok.encode(LONG_TARGET)) + 1  # the longest target, EOS included, sets the decoding length
    ids = greedy(steps, tok.eod_id)
    assert 0 < len(ids) < steps - 1
    matching = tok.decode(ids)
    pairs = list(zip(INPUTS, [matching, LONG_TARGET, "two", "a fox"]))
    data = path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"inputs": i, "targets": t}) + "\n" for i, t in pairs))
    return checkpoint, tokenizer, model, data, pairs


def test_seq2seq_scores_equal_transformers(setup):
    checkpoint, tokenizer, model, data, pairs = setup
    got = evaluation.main(["--task=seq2seq", f"--checkpoint={checkpoint}", f"--data={data}",
                           f"--tokenizer={tokenizer}", "--batch_size=4", "--data_parallel=4", "--tensor_parallel=2"])
    tok = load_tokenizer(tokenizer)
    examples = [(tok.encode(i) + [tok.eod_id], tok.encode(t) + [tok.eod_id]) for i, t in pairs]
    rows = seq2seq.seq2seq_rows(examples, max(len(i) for i, _ in examples), max(len(t) for _, t in examples))
    weights = rows["decoder_loss_weights"] > 0
    with torch.no_grad():
        logits = model(input_ids=torch.from_numpy(rows["encoder_input_tokens"].astype(np.int64)),
                       attention_mask=torch.from_numpy(rows["encoder_segment_ids"].astype(np.int64)),
                       decoder_input_ids=torch.from_numpy(rows["decoder_input_tokens"].astype(np.int64))).logits
    log_probs = torch.log_softmax(logits, -1).numpy()
    targets = rows["decoder_target_tokens"]
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(got["loss"], nll[weights].mean(), rtol=1e-5)
    np.testing.assert_allclose(got["token_accuracy"], (log_probs.argmax(-1) == targets)[weights].mean(), rtol=1e-6)
    assert got["exact_match"] == 0.25 and got["num_examples"] == 4


def test_max_examples_scores_only_the_first_pairs(setup):
    checkpoint, tokenizer, _, data, pairs = setup
    got = evaluation.main(["--task=seq2seq", f"--checkpoint={checkpoint}", f"--data={data}",
                           f"--tokenizer={tokenizer}", "--max_examples=1"])
    tok = load_tokenizer(tokenizer)
    assert (got["num_examples"], got["num_target_tokens"]) == (1, len(tok.encode(pairs[0][1])) + 1)
    assert got["exact_match"] == 1.0  # the first pair's target is the model's own greedy output


@pytest.mark.parametrize("line, message", [('{"inputs": "x"}', "no field 'targets'"),
                                           ("not json", "invalid JSON"),
                                           ('{"inputs": "x", "targets": ""}', "an empty 'targets'")])
def test_bad_lines_name_file_and_line(setup, tmp_path, line, message):
    checkpoint, tokenizer, *_ = setup
    data = tmp_path / "bad.jsonl"
    data.write_text('{"inputs": "a", "targets": "b"}\n' + line + "\n")
    with pytest.raises(ValueError, match=f"{data}:2: {message}"):
        evaluation.main(["--task=seq2seq", f"--checkpoint={checkpoint}", f"--data={data}", f"--tokenizer={tokenizer}"])
