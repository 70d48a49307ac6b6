"""Evaluation with a tokenizer whose users get a beginning-of-text token first (a Llama tokenizer.json's
post-processor): a tiny random LlamaForCausalLM saved with such a tokenizer (GPT-NeoX's 20B tokenizer plus `<s>`),
converted with from-hf, scores as its references compute with that token:

- WikiText: transformers' perplexity guide (the text encoded by the tokenizer, so one BOS at the very start;
  strided windows; per-token NLL summed here rather than through the guide's window means), within 1e-4
  relative; `--no_bos` the guide's numbers on the text encoded without it;
- LAMBADA: each context encoded with its BOS (as lm-eval's hf backend encodes contexts), the target " " + last
  word without it, within 1e-4 relative; `--no_bos` without it;
- lm_eval: lm-eval's own hf backend on the folder, request by request (loglikelihood, rolling documents,
  generate_until), with its default add_bos_token and with add_bos_token=False (`--no_bos`).

GPT-2's numbers are unchanged: tests/t5x_like/eval/test_cli.py and tests/t5x_like/eval/harness/ are untouched."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.eval import cli as evaluation  # noqa: E402
from t5x_like.eval.wikitext import wikitext_detokenize  # noqa: E402
from tests.support.environment import cpu_env  # noqa: E402
from tests.support.hf_models import bos_tokenizer, random_model  # noqa: E402
from tests.support.shared_data import shared_file  # noqa: E402

MAX_LEN, SEQ_LEN, STRIDE = 256, 64, 32


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """(folder, transformers' tokenizer, the torch model): folder/Llama-tiny as transformers saves it, folder/ours
    (from-hf of it), folder/wiki.txt (WikiText-103's first test lines), folder/lambada.jsonl (6 LAMBADA texts).
    Skips without GPT-NeoX's tokenizer or the WikiText / LAMBADA test sets in ../shared/data."""
    from t5x_like.convert import __main__ as convert

    wiki = shared_file("wikitext", "wt103-tokenized", "wiki.test.tokens")
    lambada = shared_file("lambada", "lambada_test.jsonl")
    root = tmp_path_factory.mktemp("llama_bos")
    tokenizer = bos_tokenizer(str(root / "Llama-tiny"))
    model = random_model("llama", seed=5, vocab_size=len(tokenizer), max_position_embeddings=MAX_LEN)
    model.save_pretrained(root / "Llama-tiny")
    convert.main(["from-hf", str(root / "Llama-tiny"), str(root / "ours")])
    lines = wiki.read_text(encoding="utf-8").splitlines()
    (root / "wiki.txt").write_text("\n".join(lines[:12]) + "\n", encoding="utf-8")
    texts = lambada.read_text(encoding="utf-8").splitlines()[:6]
    (root / "lambada.jsonl").write_text("\n".join(texts) + "\n", encoding="utf-8")
    return root, tokenizer, model


def guide_nll(model, ids: list[int], max_length: int, stride: int) -> tuple[float, int]:
    """(Σ NLL, tokens scored) over `ids` in the windows of transformers' perplexity guide: windows of max_length
    ids starting every `stride`, each scoring the labels past the previous window's end (the first window all but
    its first id)."""
    total, count, previous_end = 0.0, 0, 0
    for begin in range(0, len(ids), stride):
        end = min(begin + max_length, len(ids))
        window = torch.tensor(ids[begin:end])
        with torch.no_grad():
            logits = model(window[None]).logits[0, :-1].double()
        nll = torch.nn.functional.cross_entropy(logits, window[1:], reduction="none")  # position i predicts i + 1
        scored = nll[max(len(window) - (end - previous_end), 1) - 1:]
        total, count, previous_end = total + float(scored.sum()), count + len(scored), end
        if end == len(ids):
            return total, count
    raise AssertionError("unreachable")


def test_the_tokenizer_names_the_bos_its_post_processor_puts_first(llama):
    from t5x_like.data.tokenizer import load_tokenizer
    from t5x_like.inference import loading

    root, tokenizer, _ = llama
    config, _ = loading.read_config(str(root / "ours"))
    ours = loading.checkpoint_tokenizer(str(root / "ours"), config)
    assert ours.bos_id == tokenizer.bos_token_id == tokenizer("Hi").input_ids[0]
    assert ours.encode("Hi") == tokenizer("Hi", add_special_tokens=False).input_ids
    neox = shared_file("gpt-neox-20b-tokenizer", "20B_tokenizer.json")
    assert load_tokenizer(neox).bos_id is None and load_tokenizer(shared_file("gpt2-bpe")).bos_id is None


@pytest.mark.system
def test_wikitext_equals_the_transformers_guide_with_bos_and_without_it(llama):
    """As a user runs it, from the folder with relative paths: the CLI's numbers and summary; then --no_bos."""
    root, tokenizer, model = llama
    done = subprocess.run([sys.executable, "-m", "t5x_like.eval", "--task=wikitext", "--checkpoint=ours",
                           "--data=wiki.txt", f"--seq_len={SEQ_LEN}", f"--stride={STRIDE}", "--batch_size=4",
                           "--output=results/wikitext.json"],
                          cwd=root, env=cpu_env(1), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((root / "results" / "wikitext.json").read_text())
    bos = tokenizer.bos_token_id
    assert f"after BOS <s> (id {bos}; --no_bos scores without it)" in done.stdout
    text = (root / "wiki.txt").read_text(encoding="utf-8")
    words = len(text.strip().split(" "))
    ids = tokenizer(wikitext_detokenize(text)).input_ids
    assert ids[0] == bos and len(ids) > 8 * SEQ_LEN
    nll, count = guide_nll(model, ids, SEQ_LEN + 1, STRIDE)
    assert (result["bos_id"], result["bos_token"], result["num_tokenized_tokens"]) == (bos, "<s>", len(ids) - 1)
    assert result["loss"] == pytest.approx(nll / count, rel=1e-4) and count == len(ids) - 1
    assert result["adjusted_ppl"] == pytest.approx(np.exp(nll / words), rel=1e-4)

    raw = evaluation.main(["--task=wikitext", f"--checkpoint={root / 'ours'}", f"--data={root / 'wiki.txt'}",
                           f"--seq_len={SEQ_LEN}", f"--stride={STRIDE}", "--batch_size=4", "--no_bos"])
    raw_nll, raw_count = guide_nll(model, ids[1:], SEQ_LEN + 1, STRIDE)
    assert raw["loss"] == pytest.approx(raw_nll / raw_count, rel=1e-4) and raw["bos_id"] is None
    assert raw["adjusted_ppl"] == pytest.approx(np.exp(raw_nll / (words - 1)), rel=1e-4)
    assert "BOS" not in evaluation.summary(raw)
    assert abs(raw_nll / raw_count - nll / count) > 1e-3 * nll / count  # the BOS matters to this model


def lambada_reference(model, tokenizer, path: Path, with_bos: bool) -> tuple[int, float, int]:
    """(examples whose every target token is the argmax, Σ target NLL, target tokens): the context encoded as the
    tokenizer encodes it (with BOS) or without it, the target " " + last word without it."""
    correct, total, count = 0, 0.0, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        text = json.loads(line)["text"]
        word = text.split()[-1]
        context = tokenizer(text[:text.rfind(word)].strip(), add_special_tokens=with_bos).input_ids
        target = tokenizer(" " + word, add_special_tokens=False).input_ids
        ids = torch.tensor((context + target)[-(MAX_LEN + 1):])
        with torch.no_grad():
            logits = model(ids[None, :-1]).logits[0, -len(target):].double()
        correct += bool((logits.argmax(-1) == ids[-len(target):]).all())
        total += float(torch.nn.functional.cross_entropy(logits, ids[-len(target):], reduction="sum"))
        count += len(target)
    return correct, total, count


def test_lambada_contexts_start_with_the_bos_unless_told_not_to(llama):
    root, tokenizer, model = llama
    losses = {}
    for with_bos in (True, False):
        result = evaluation.main(["--task=lambada", f"--checkpoint={root / 'ours'}",
                                  f"--data={root / 'lambada.jsonl'}", "--batch_size=4"] + ["--no_bos"] * (not with_bos))
        correct, nll, count = lambada_reference(model, tokenizer, root / "lambada.jsonl", with_bos)
        assert (result["num_correct"], result["num_target_tokens"], result["num_examples"]) == (correct, count, 6)
        assert result["loss"] == pytest.approx(nll / count, rel=1e-4)
        assert result["bos_id"] == (tokenizer.bos_token_id if with_bos else None)
        assert ("after BOS <s>" in evaluation.summary(result)) == with_bos
        losses[with_bos] = nll / count
    assert abs(losses[True] - losses[False]) > 1e-3 * losses[True]


@pytest.fixture(scope="module")
def lm_pairs(llama):
    """{add_bos_token: (lm-eval's hf backend on the folder, our CheckpointLM on its conversion)} for lm-eval's
    default (None: the tokenizer's own) and False."""
    pytest.importorskip("lm_eval", reason="needs the lm_eval extra")
    import jax
    from lm_eval.models.huggingface import HFLM

    from partitioning import Partitioner, make_mesh
    from t5x_like.eval.harness.model import CheckpointLM
    from t5x_like.inference import loading

    root, _, _ = llama
    checkpoint = str(root / "ours")
    config, _ = loading.read_config(checkpoint)
    partitioner = Partitioner(make_mesh(data=1, devices=jax.devices()[:1]), "fsdp_tensor")
    params = loading.restore_sharded(checkpoint, config, partitioner)
    tokenizer = loading.checkpoint_tokenizer(checkpoint, config)
    pairs = {}
    for add_bos_token in (None, False):
        theirs = HFLM(pretrained=str(root / "Llama-tiny"), batch_size=4, device="cpu", dtype="float32",
                      add_bos_token=add_bos_token)
        ours = CheckpointLM(config, params, partitioner, tokenizer, batch_size=4, name=checkpoint,
                            add_bos_token=add_bos_token)
        assert ours.max_length == theirs.max_length == MAX_LEN
        pairs[add_bos_token] = theirs, ours
    return pairs


def test_lm_eval_requests_equal_lm_evals_hf_backend_with_a_bos_tokenizer(llama, lm_pairs):
    """Per request within 1e-4 (a rolling document's sum within 1e-6 relative): contexts with the BOS first (none
    added to a context that spells it), an empty context conditioned on it, rolling documents encoded with it
    after the BOS prefix (lm-eval's own two BOS), greedy generations; and with add_bos_token=False none of it
    but the prefix."""
    from lm_eval.api.instance import Instance

    root, tokenizer, _ = llama
    texts = [json.loads(line)["text"] for line in (root / "lambada.jsonl").read_text(encoding="utf-8").splitlines()]
    pairs = [("The quick brown fox", " jumps over"), ("", "Hello world"), ("<s>Question: why?", " Because")]
    pairs += [(text[:text.rfind(text.split()[-1])], text.split()[-1]) for text in texts[:2]]
    documents = [wikitext_detokenize((root / "wiki.txt").read_text(encoding="utf-8")), "A short document."]
    loglikelihood = [Instance("loglikelihood", {}, pair, 0) for pair in pairs]
    rolling = [Instance("loglikelihood_rolling", {}, (document,), 0) for document in documents]
    generation = [Instance("generate_until", {}, ("Question: what is it?\nAnswer:", {"until": ["\n"],
                                                                                      "max_gen_toks": 8}), 0)]
    scores = {}
    for add_bos_token, (theirs, ours) in lm_pairs.items():
        assert ours.tok_encode("Hi") == theirs.tok_encode("Hi") == ([tokenizer.bos_token_id] * (add_bos_token is None)
                                                                    + tokenizer("Hi", add_special_tokens=False).input_ids)
        assert ours.prefix_token_id == theirs.prefix_token_id == tokenizer.bos_token_id
        assert len(theirs.tok_encode(documents[0])) > 2 * MAX_LEN  # several rolling windows
        mine, reference = ours.loglikelihood(loglikelihood), theirs.loglikelihood(loglikelihood)
        assert [greedy for _, greedy in mine] == [greedy for _, greedy in reference]
        assert [ll for ll, _ in mine] == pytest.approx([ll for ll, _ in reference], abs=1e-4)
        assert ours.loglikelihood_rolling(rolling) == pytest.approx(theirs.loglikelihood_rolling(rolling), rel=1e-6)
        assert ours.generate_until(generation) == theirs.generate_until(generation)
        scores[add_bos_token] = [ll for ll, _ in mine]
    # the BOS moves the scores of the contexts it starts; an empty context and one spelling "<s>" read it either way
    changed = [abs(a - b) > 1e-3 for a, b in zip(scores[None], scores[False])]
    assert changed == [True, False, False, True, True]


@pytest.mark.parametrize("task", ["tokens", "seq2seq", "classification"])
def test_no_bos_is_refused_by_the_tasks_it_does_not_apply_to(task, tmp_path):
    with pytest.raises(ValueError, match=f"--no_bos applies to --task=wikitext, lambada and lm_eval .* not {task}"):
        evaluation.main([f"--task={task}", f"--checkpoint={tmp_path}", f"--data={tmp_path / 'data'}", "--no_bos"])
