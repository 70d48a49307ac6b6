"""generate's options for GPT2-Chinese and CPM-Generate users, short of running a model: the repetition penalty
against transformers' RepetitionPenaltyLogitsProcessor, several samples per prompt as records, the interactive
prompt loop, and --help showing every default."""
import io
import re
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from t5x_like.inference import decoding, prompts


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_the_repetition_penalty_is_transformers(penalty):
    torch = pytest.importorskip("torch", reason="needs the torch extra")
    processors = pytest.importorskip("transformers.generation.logits_process", reason="needs transformers")
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 50)).astype(np.float32) * 4
    histories = [[1, 5, 5, 49], [0], [7, 8, 9, 10, 11, 3, 3]]
    theirs = np.stack([processors.RepetitionPenaltyLogitsProcessor(penalty)(
        torch.tensor([ids]), torch.tensor(logits[row:row + 1])).numpy()[0] for row, ids in enumerate(histories)])
    seen = np.zeros((3, 50), bool)
    for row, ids in enumerate(histories):
        seen[row, ids] = True
    ours = decoding.penalize_repetition(jnp.asarray(logits), jnp.asarray(seen), penalty)
    np.testing.assert_allclose(np.asarray(ours), theirs, rtol=1e-6)
    greedy = decoding.sample(jnp.asarray(logits), None, decoding.Sampling(0.0, repetition_penalty=penalty),
                             jnp.asarray(seen))
    assert np.asarray(greedy).tolist() == theirs.argmax(-1).tolist()


def test_several_samples_per_prompt_are_numbered_records():
    done = prompts.records(["a", "b"], [[7], [8, 9]], [[1], [2, 3], [4], [5, 6]], lambda ids: "x" * len(ids),
                           max_new_tokens=2, num_samples=2)
    assert [(r["prompt"], r["prompt_tokens"], r["sample"], r["completion"], r["finish_reason"]) for r in done] == [
        ("a", [7], 1, "x", "eod"), ("a", [7], 2, "xx", "length"), ("b", [8, 9], 1, "x", "eod"),
        ("b", [8, 9], 2, "xx", "length")]
    assert "sample" not in prompts.records(["a"], [[7]], [[1]], str, 2, 1)[0]
    shown = io.StringIO()
    prompts.show(done[:2], "", shown)
    assert shown.getvalue().splitlines()[0] == f"{'=' * 40} SAMPLE 1 {'=' * 40}"


def test_the_interactive_loop_reads_until_stop():
    typed, shown = io.StringIO("今天天气\n\nline one\\nline two\nstop\nnever read\n"), io.StringIO()
    assert list(prompts.typed_prompts(typed, shown)) == ["今天天气", "line one\nline two"]
    assert shown.getvalue().count("prompt (stop to exit) >>> ") == 4
    assert "a prompt should not be empty" in shown.getvalue()
    assert list(prompts.typed_prompts(io.StringIO(""), io.StringIO())) == []  # end of input


@pytest.mark.system
def test_help_shows_every_default():
    text = subprocess.run([sys.executable, "-m", "t5x_like.generate", "--help"], capture_output=True, text=True,
                          check=True).stdout
    options = text.split("options:", 1)[1]
    blocks = {block.split()[0]: " ".join(block.split()) for block in re.split(r"\n(?=  -)", options) if block.strip()}
    for flag, default in (("--max_new_tokens", "64"), ("--num_samples", "1"), ("--temperature", "1.0"),
                          ("--top_k", "0"), ("--top_p", "1.0"), ("--repetition_penalty", "1.0"), ("--seed", "0"),
                          ("--batch_size", "8"), ("--num_beams", "1")):
        assert blocks[flag].endswith(f"(default: {default})"), blocks[flag]
    assert "--interactive" in blocks


@pytest.mark.parametrize("flags, message", [
    (["--num_samples=3", "--temperature=0"], "--num_samples=3 with --temperature=0 .greedy. gives 3 identical"),
    (["--num_beams=2", "--repetition_penalty=1.2"], "--num_beams=2 searches deterministically"),
    (["--repetition_penalty=0"], "--repetition_penalty=0: must be above 0"),
    (["--num_samples=0"], "--num_samples=0: must be >= 1")])
@pytest.mark.system
def test_contradictory_sampling_flags_are_refused(flags, message, tmp_path):
    done = subprocess.run([sys.executable, "-m", "t5x_like.generate", f"--checkpoint={tmp_path}", "--prompt=x", *flags],
                          capture_output=True, text=True)
    assert done.returncode == 1 and re.search(message, done.stderr.splitlines()[-1]), done.stderr
