"""t5x_like.eval.cli: the WikiText detokenizer, strided windows, and WikiText / LAMBADA / token-file numbers
of a converted model against independent torch computations written here."""
import json
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from partitioning import Partitioner, make_mesh
from t5x_like.errors import UserError
from t5x_like.eval import cli as evaluation
from t5x_like.eval import scoring, wikitext
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS
from t5x_like.inference import loading
from tests.support.shared_data import shared_file

SEQ_LEN, STRIDE = 32, 8


def gpt2_bpe():
    return shared_file("gpt2-bpe")


@pytest.mark.parametrize("text, expected", [
    ("a @-@ b 1 @,@ 000 3 @.@ 5", "a-b 1,000 3.5"),
    ("He said : no ; then . Yes ! Why ? So , fine", "He said: no; then. Yes! Why? So, fine"),
    ("( the 2000 film ) and [ 1 ] and { x }", "(the 2000 film) and [1] and {x}"),
    ('in " Teddy \'s Story " of', 'in "Teddy\'s Story" of'),
    ("the players ' union", "the players' union"),
    (" = Robert Boulter = \n \n = = Career = = \n = = = 2000 = = = \n", " = Robert Boulter =\n\n== Career ==\n=== 2000 ===\n"),
    ("at 40 \u00b0 C", "at 40\u00b0C"),
    ("about N people", "about 1 people"),
])
def test_wikitext_detokenizer(text, expected):
    assert wikitext.wikitext_detokenize(text) == expected


@pytest.mark.parametrize("num_tokens, seq_len, stride", [(2, 4, 4), (9, 4, 4), (10, 4, 4), (23, 8, 3), (8, 8, 1)])
def test_windows_score_every_target_once_with_enough_context(num_tokens, seq_len, stride):
    tokens = np.arange(num_tokens)
    count = scoring.num_windows(num_tokens, seq_len, stride)
    rows = scoring.window_rows(tokens, seq_len, stride, 0, count)
    scored = rows[DECODER_TARGET_TOKENS][rows[DECODER_LOSS_WEIGHTS] > 0]
    assert sorted(scored) == list(range(1, num_tokens))
    for window in range(1, count):  # later windows score targets with >= seq_len - stride tokens before them
        assert (np.nonzero(rows[DECODER_LOSS_WEIGHTS][window])[0] >= seq_len - stride).all()
    np.testing.assert_array_equal(rows[DECODER_TARGET_TOKENS][rows[DECODER_LOSS_WEIGHTS] > 0] - 1, rows[DECODER_INPUT_TOKENS][rows[DECODER_LOSS_WEIGHTS] > 0])


# ----------------------------------------------------------------- against torch (converted model)

@pytest.fixture(scope="module")
def converted(tmp_path_factory, random_hf_gpt2):
    """(our checkpoint dir, the HF torch model it came from, a transformers GPT-2 tokenizer)."""
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
    bpe = shared_file("gpt2-bpe")
    from t5x_like.convert import hf

    model = random_hf_gpt2(0.2)
    path = tmp_path_factory.mktemp("model")
    model.save_pretrained(path / "hf")
    hf.from_hf(str(path / "hf"), str(path / "ours"))
    (path / "tok").mkdir()  # transformers reads OpenAI's encoder.json / vocab.bpe under HF names
    shutil.copyfile(bpe / "encoder.json", path / "tok" / "vocab.json")
    shutil.copyfile(bpe / "vocab.bpe", path / "tok" / "merges.txt")
    tokenizer = transformers.GPT2TokenizerFast.from_pretrained(path / "tok")
    assert tokenizer("Hello world")["input_ids"] == [15496, 995]
    return path / "ours", model, tokenizer


def reference_detokenize(s):
    """Megatron-LM's wikitext_detokenizer, step by step (independent of t5x_like.eval.cli)."""
    s = s.replace("s '", "s'")
    for sep in "-,.":
        s = s.replace(f" @{sep}@ ", sep)
    for p in ":;.!?,":
        s = s.replace(f" {p} ", f"{p} ")
    s = re.sub(r"\(\s*([^\)]*?)\s*\)", r"(\1)", s)
    s = re.sub(r"\[\s*([^\]]*?)\s*\]", r"[\1]", s)
    s = re.sub(r"{\s*([^}]*?)\s*}", r"{\1}", s)
    s = re.sub(r"\"\s*([^\"]*?)\s*\"", r'"\1"', s)
    s = re.sub(r"'\s*([^']*?)\s*'", r"'\1'", s)
    s = s.replace("= = = =", "====").replace("= = =", "===").replace("= =", "==")
    s = s.replace(" \u00b0 ", "\u00b0").replace(" \n", "\n").replace("\n ", "\n")
    return s.replace(" N ", " 1 ").replace(" 's", "'s")


def reference_stream_nll(model, ids, seq_len, stride):
    """Σ nll of every target, each scored once in the window that first reaches it (torch)."""
    import torch

    total, scored_until, begin = 0.0, 0, 0
    while scored_until < len(ids) - 1:
        end = min(begin + seq_len, len(ids) - 1)
        window = torch.tensor(ids[begin:end + 1])
        with torch.no_grad():
            logits = model(window[None, :-1]).logits[0].double()
        nll = torch.nn.functional.cross_entropy(logits, window[1:], reduction="none")
        total += float(nll[-(end - scored_until):].sum())
        scored_until, begin = end, begin + stride
    return total


def wikitext_excerpt(tmp_path, name):
    lines = (shared_file("wikitext") / name).read_text(encoding="utf-8").splitlines(keepends=True)[:14]
    path = tmp_path / "excerpt.txt"
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["wt103-tokenized/wiki.test.tokens", "wt-raw/wiki.test.raw"])
def test_wikitext_equals_independent_torch_implementation(converted, tmp_path, name):
    checkpoint, model, tokenizer = converted
    data = wikitext_excerpt(tmp_path, name)
    result = evaluation.main(["--task=wikitext", f"--checkpoint={checkpoint}", f"--data={data}",
                              f"--tokenizer={gpt2_bpe()}", f"--seq_len={SEQ_LEN}", f"--stride={STRIDE}",
                              "--batch_size=8", "--tensor_parallel=2", f"--output={tmp_path / 'out.json'}"])
    text = data.read_text(encoding="utf-8")
    ids = tokenizer(reference_detokenize(text))["input_ids"]
    original = len(text.strip().split(" "))
    nll = reference_stream_nll(model, ids, SEQ_LEN, STRIDE)
    written = json.loads((tmp_path / "out.json").read_text())
    assert written == pytest.approx(result)
    assert (written["num_tokenized_tokens"], written["num_original_tokens"]) == (len(ids), original)
    assert (written["seq_len"], written["stride"]) == (SEQ_LEN, STRIDE)
    assert len(ids) > 20 * STRIDE
    assert written["loss"] == pytest.approx(nll / (len(ids) - 1), rel=1e-5)
    assert written["ppl"] == pytest.approx(np.exp(nll / (len(ids) - 1)), rel=1e-4)
    assert written["adjusted_ppl"] == pytest.approx(np.exp(nll / (original - 1)), rel=1e-4)


def test_wikitext_with_a_limit_scores_part_and_says_adjusted_ppl_is_not_available(converted, tmp_path):
    checkpoint, _, _ = converted
    data = wikitext_excerpt(tmp_path, "wt103-tokenized/wiki.test.tokens")
    result = evaluation.main(["--task=wikitext", f"--checkpoint={checkpoint}", f"--data={data}",
                              f"--tokenizer={gpt2_bpe()}", f"--seq_len={SEQ_LEN}", f"--stride={STRIDE}",
                              "--batch_size=2", "--max_batches=1"])
    assert result["adjusted_ppl"] is None and 0 < result["num_scored_tokens"] < result["num_tokenized_tokens"]
    assert f"adjusted ppl n/a ({result['num_scored_tokens']:,} tokens scored" in evaluation.summary(result)


def test_lambada_equals_direct_computation(converted, tmp_path):
    import torch

    checkpoint, model, tokenizer = converted
    texts = [json.loads(line)["text"] for line in
             shared_file("lambada", "lambada_test.jsonl").read_text(encoding="utf-8").splitlines()[:6]]
    data = tmp_path / "lambada.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    for last_token in (False, True):
        result = evaluation.main(["--task=lambada", f"--checkpoint={checkpoint}", f"--data={data}",
                                  f"--tokenizer={gpt2_bpe()}", "--batch_size=4"]
                                 + ["--lambada_last_token"] * last_token)
        correct, nll, count = 0, 0.0, 0
        for text in texts:
            if last_token:
                ids = tokenizer(text)["input_ids"]
                context, target = ids[:-1], ids[-1:]
            else:
                word = text.split()[-1]
                context = tokenizer(text[:text.rfind(word)].strip())["input_ids"]
                target = tokenizer(" " + word)["input_ids"]
            ids = torch.tensor((context + target)[-41:])  # the model's 40 positions + the last target
            with torch.no_grad():
                logits = model(ids[None, :-1]).logits[0, -len(target):].double()
            correct += bool((logits.argmax(-1) == ids[-len(target):]).all())
            nll += float(torch.nn.functional.cross_entropy(logits, ids[-len(target):], reduction="sum"))
            count += len(target)
        assert (result["num_examples"], result["num_correct"], result["num_target_tokens"]) == (6, correct, count)
        assert result["accuracy"] == correct / 6
        assert result["loss"] == pytest.approx(nll / count, rel=1e-5)
        assert result["method"] == ("last BPE token" if last_token else "strict whole word")


def test_accuracy_counts_a_row_only_when_every_target_is_the_argmax(converted):
    import models

    checkpoint, _, _ = converted
    config, _ = loading.read_config(str(checkpoint))
    partitioner = Partitioner(make_mesh(), "fsdp_tensor")
    params = loading.restore_sharded(str(checkpoint), config, partitioner)
    inputs = np.random.default_rng(0).integers(0, 50257, (2, 8)).astype(np.int32)
    with partitioner.activate():
        logits = jax.jit(lambda p, t: models.build_model(config).apply({"params": p}, t))(params, inputs)
    argmax = np.asarray(jax.device_get(logits)).argmax(-1).astype(np.int32)
    targets = argmax.copy()
    targets[1, 6] = (targets[1, 6] + 1) % 50257  # row 1: one scored target is not the argmax
    weights = np.zeros((2, 8), np.float32)
    weights[:, 5:7] = 1.0
    scorer = scoring.Scorer(config, params, partitioner, batch_size=2)
    out = scorer.score([{DECODER_INPUT_TOKENS: inputs, DECODER_TARGET_TOKENS: targets, DECODER_LOSS_WEIGHTS: weights}], 1, "test")
    assert out["all_correct"].tolist() == [True, False]


def test_token_file_loss_equals_torch(converted, tmp_path):
    from t5x_like.data.token_file import TokenFileWriter

    checkpoint, model, _ = converted
    ids = np.random.default_rng(1).integers(0, 50257, 100)
    with TokenFileWriter(tmp_path / "val", np.int32, {"tokenizer": "test"}) as writer:
        writer.write(ids, np.array([60, 40]))
    result = evaluation.main(["--task=tokens", f"--checkpoint={checkpoint}", f"--data={tmp_path / 'val'}",
                              f"--seq_len={SEQ_LEN}"])
    nll = reference_stream_nll(model, ids.tolist(), SEQ_LEN, SEQ_LEN)
    assert (result["num_tokens"], result["stride"]) == (100, SEQ_LEN)
    assert result["loss"] == pytest.approx(nll / 99, rel=1e-5)
    with TokenFileWriter(tmp_path / "other", np.int32, {"tokenizer": "test"}) as writer:
        writer.write(np.array([5, 60000, 7]), np.array([3]))
    with pytest.raises(ValueError, match="holds id 60000 but the model's vocab_size is 50257"):
        evaluation.main(["--task=tokens", f"--checkpoint={checkpoint}", f"--data={tmp_path / 'other'}"])


def test_bad_arguments_are_refused(converted, tmp_path):
    checkpoint, _, _ = converted
    data = tmp_path / "x.txt"
    data.write_text(" = A = \n some text here , and more text . \n" * 20)
    with pytest.raises(ValueError, match="--stride=40 must be between 1 and --seq_len=32"):
        evaluation.main(["--task=wikitext", f"--checkpoint={checkpoint}", f"--data={data}",
                         f"--tokenizer={gpt2_bpe()}", "--seq_len=32", "--stride=40"])
    with pytest.raises(ValueError, match="records no tokenizer; pass --tokenizer"):
        evaluation.main(["--task=wikitext", f"--checkpoint={checkpoint}", f"--data={data}"])
    with pytest.raises(ValueError, match="--seq_len=64 exceeds the model's max_len 40"):
        evaluation.main(["--task=wikitext", f"--checkpoint={checkpoint}", f"--data={data}",
                         f"--tokenizer={gpt2_bpe()}", "--seq_len=64"])


def test_token_file_limits_and_the_runs_validation_split_equal_torch(converted, tmp_path):
    from t5x_like.data.token_file import TokenFileWriter

    checkpoint, model, _ = converted
    run_dir = tmp_path / "run"
    shutil.copytree(checkpoint, run_dir)
    (run_dir / "config.gin").write_text("DATA_SPLIT = '50,50,0'\n")  # as train writes it
    ids = np.random.default_rng(2).integers(0, 50257, 150)
    with TokenFileWriter(tmp_path / "corpus", np.int32, {"tokenizer": "test"}) as writer:
        writer.write(ids, np.array([60, 40, 30, 20]))
    args = ["--task=tokens", f"--checkpoint={run_dir}", f"--data={tmp_path / 'corpus'}", f"--seq_len={SEQ_LEN}"]

    one_window = evaluation.main([*args, "--max_examples=1"])
    assert (one_window["num_scored_tokens"], one_window["num_tokens"]) == (SEQ_LEN, 150)
    assert one_window["loss"] == pytest.approx(reference_stream_nll(model, ids[:SEQ_LEN + 1].tolist(), SEQ_LEN,
                                                                    SEQ_LEN) / SEQ_LEN, rel=1e-5)
    two_windows = evaluation.main([*args, "--max_batches=1", "--batch_size=2", "--data_parallel=2",
                                   "--tensor_parallel=4"])
    assert two_windows["num_scored_tokens"] == 2 * SEQ_LEN
    # DATA_SPLIT '50,50,0' over 4 documents: validation is documents 2 and 3, ids[100:150].
    validation = evaluation.main([*args, "--split=validation"])
    held_out = ids[100:].tolist()
    assert (validation["num_tokens"], validation["data_split"]) == (50, "50,50,0")
    assert validation["loss"] == pytest.approx(reference_stream_nll(model, held_out, SEQ_LEN, SEQ_LEN) / 49, rel=1e-5)
    assert "validation split under DATA_SPLIT='50,50,0'" in evaluation.summary(validation)
    (run_dir / "operative_config.gin").write_text("BATCH_SIZE = 8\nDATA_SPLIT = '80,20,0'\n")  # preferred
    assert evaluation.run_data_split(str(run_dir)) == "80,20,0"


@pytest.mark.parametrize("task, name, content, match", [
    ("wikitext", "lambada.jsonl", '{"text": "a b c"}\n', "holds JSON lines, not WikiText"),
    ("lambada", "wiki.txt", " = Heading = \n text .\n", "reads JSON lines with a 'text' field"),
    ("tokens", "wiki.txt", " = Heading = \n", "is a text file; --task=tokens takes a token-file prefix"),
    ("tokens", "corpus.bin", "", "pass the token file's prefix, without .bin"),
])
def test_data_of_the_wrong_shape_is_refused(tmp_path, task, name, content, match):
    (tmp_path / name).write_text(content)
    args = evaluation.parse_args([f"--task={task}", "--checkpoint=unused", f"--data={tmp_path / name}"])
    with pytest.raises(UserError, match=match):
        evaluation.check_arguments(args)


def test_a_token_file_prefix_given_to_wikitext_says_use_tokens(tmp_path):
    (tmp_path / "corpus.bin").write_bytes(b"")
    args = evaluation.parse_args(["--task=wikitext", "--checkpoint=unused", f"--data={tmp_path / 'corpus'}"])
    with pytest.raises(UserError, match="it is a token file: use --task=tokens"):
        evaluation.check_arguments(args)


def test_row_limit_takes_the_smaller_limit():
    assert evaluation.row_limit(None, None, 8) is None
    assert evaluation.row_limit(3, None, 8) == 24 and evaluation.row_limit(3, 10, 8) == 10
    with pytest.raises(UserError, match="limits must be positive"):
        evaluation.row_limit(0, None, 8)
